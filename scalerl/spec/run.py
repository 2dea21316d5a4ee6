"""The ScaleRLRun: its processes (trainers, generators), checkpoints and pods' user, the spec that
holds every part, and the resource as parsed at the edge (`load_run`, `parse_run`).

A spec is parsed once, at the edge, into frozen models; every process then reads only its own
slice. Field names are the YAML's camelCase; Python attributes are snake_case. Defaults and
numbers come from "The Art of Scaling RL Compute for LLMs" (arXiv 2510.13786) unless a comment
says otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from scalerl.errors import SpecError
from scalerl.spec.base import (
    _DNS_LABEL,
    MAX_GPUS,
    MAX_REPLICAS,
    MAX_STEPS,
    Bool,
    Int,
    _at,
    _Model,
    _Resource,
)
from scalerl.spec.budget import BudgetSpec, FailurePolicySpec
from scalerl.spec.data import DataSpec
from scalerl.spec.environment import EnvironmentSpec
from scalerl.spec.evaluation import (
    FIT_MIN_POINTS,
    PREDICTION_MIN_POINTS,
    EvaluationSpec,
    FitSpec,
    evaluation_steps,
)
from scalerl.spec.model import ModelSpec
from scalerl.spec.parsing import _load, _problems
from scalerl.spec.recipe import INTERRUPTION_TEXT, RecipeSpec, _rounds
from scalerl.spec.scheduling import QUEUE_LABEL, RunSchedulingSpec, SchedulingSpec
from scalerl.spec.tracking import HubSpec, TrackingSpec

KIND = "ScaleRLRun"
# What a GPU pod requests besides its GPUs, per GPU, unless its resources say otherwise: without
# requests it would be BestEffort, the first evicted under memory pressure. /dev/shm (memory)
# may hold up to SHM_PER_GPU_GIB per GPU (SHM_CPU_POD_GIB in a CPU pod).
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 32
SHM_PER_GPU_GIB = 8
SHM_CPU_POD_GIB = 1


class ReplicaSpec(_Model):
    replicas: Int = Field(1, ge=1, le=MAX_REPLICAS)
    gpus: Int = Field(8, ge=0, le=MAX_GPUS, description="GPUs per replica (0 = CPU).")
    image: str | None = Field(None, min_length=1, description="Container image (cluster only).")
    resources: dict[str, Any] = Field(
        default_factory=dict,
        description="Container resources (requests/limits) in the cluster. A GPU pod requests "
        f"{CPU_PER_GPU} CPUs and {MEMORY_PER_GPU_GIB}Gi of memory per GPU unless these say.",
    )
    scheduling: SchedulingSpec = Field(
        SchedulingSpec(), description="This role's scheduling; its fields replace the run's."
    )


class GeneratorsSpec(ReplicaSpec):
    """The generator processes (pods): vLLM engines that sample the rollouts."""

    replicas: Int = Field(8, ge=1, le=MAX_REPLICAS, description="Generator processes (pods).")
    min_replicas: Int = Field(
        1,
        ge=1,
        le=MAX_REPLICAS,
        description="With fewer generators sampling (lost ones being replaced), training waits "
        "for them rather than trains on fewer (condition Degraded, reason BelowMinReplicas), up "
        "to failurePolicy.startupTimeoutSeconds; at or above it training goes on (reason "
        "GeneratorsShort). Taken as replicas where it is larger (a run scaled down). The "
        "default 1 trains on while any generator samples.",
    )
    tensor_parallel: Int = Field(
        1, ge=1, le=MAX_GPUS, description="vLLM tensor-parallel size of each generator's engine."
    )


class TrainersSpec(ReplicaSpec):
    """The trainer processes (pods); several ranks shard the policy with FSDP2."""

    replicas: Int = Field(
        2,
        ge=1,
        le=MAX_REPLICAS,
        description="Trainer ranks (processes, pods): the policy is sharded over them (FSDP2).",
    )
    micro_batch_tokens: Int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Tokens (prompt + completion) per forward and backward pass; null: the "
        "whole batch at once. The step is the full batch's either way (gradient accumulation).",
    )
    pack_sequences: Bool = Field(
        True,
        description="Run each micro-batch's sequences as one row without padding (attention "
        "kept within each sequence).",
    )
    activation_checkpointing: Bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them: less memory, about a third more compute.",
    )


class PodSecuritySpec(_Model):
    """The run's pods' user, where it differs from the operator's setting (the chart's
    podSecurity.runAsUser)."""

    run_as_user: Int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="The user (also group and fsGroup) ID the run's pods run as; null: none, the "
        "platform assigns them (OpenShift's restricted-v2 refuses pods that name their own).",
    )


class CheckpointSpec(_Model):
    """Where and how often checkpoints are written; a restart resumes from the newest."""

    claim_name: str | None = Field(
        None, min_length=1, description="PVC holding checkpoints in the cluster."
    )
    every_steps: Int = Field(
        100, ge=1, le=MAX_STEPS, description="Write a checkpoint every N steps."
    )
    keep: Int = Field(2, ge=1, le=1000, description="Newest checkpoints kept.")
    create_run_directory: Bool = Field(
        False,
        description="Before each pod starts, an init container creates runs/<run> on the claim "
        "as the pods' user. For claims that ignore fsGroup (many NFS provisioners), where the "
        "kubelet would create it owned by root and the trainer could not write its checkpoints; "
        "the claim's runs/ must be writable by the pods' user.",
    )


class RunSpec(_Model):
    model: ModelSpec
    data: DataSpec = Field(
        DataSpec(),
        description="The prompts and their reward (data.train), or, with environment, what the "
        "environment does not give.",
    )
    environment: EnvironmentSpec | None = Field(
        None,
        description="Multi-turn and tool-use rollouts from a verifiers environment or an "
        "OpenEnv server instead of data.train + data.reward (README: Agents and tools).",
    )
    recipe: RecipeSpec = RecipeSpec()
    evaluation: EvaluationSpec = EvaluationSpec()
    fit: FitSpec = FitSpec()
    budget: BudgetSpec = BudgetSpec()
    generators: GeneratorsSpec = GeneratorsSpec()
    trainers: TrainersSpec = TrainersSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    failure_policy: FailurePolicySpec = FailurePolicySpec()
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="disaggregated: a process (pod) per trainer rank and generator, weights "
        "broadcast. colocated: one process (pod) holds the trainer and one vLLM engine, which "
        "share its device; weights move in memory.",
    )
    scheduling: RunSchedulingSpec = Field(
        RunSchedulingSpec(),
        description="Where the run's pods may run (trainers and generators), and its queue.",
    )
    pod_security: PodSecuritySpec | None = Field(
        None, description="Absent: the pods run as the operator is set up to run them."
    )
    suspend: Bool = Field(
        False,
        description="true: the pods go and the checkpoints stay (compute clock stopped); false "
        "resumes from them.",
    )
    seed: Int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="The run's random seed: sampling, held-out evaluations, a fresh adapter.",
    )
    tracking: TrackingSpec | None = Field(
        None, description="Experiment trackers (MLflow, TensorBoard, W&B, trackio); null: none."
    )
    hub: HubSpec = Field(
        HubSpec(),
        description="On a cluster: the token Secret and mirror the initializer Job reads hf:// "
        "ids with.",
    )

    @model_validator(mode="after")
    def _thinking_consistent(self) -> RunSpec:
        if self.model.think_end is None and self.recipe.length.interruption.enabled:
            raise _at(
                "recipe.length.interruption.enabled",
                "must be false when model.thinkEnd is null (a model that does not think "
                "cannot be interrupted)",
            )
        return self

    @model_validator(mode="after")
    def _prompts_from_one_place(self) -> RunSpec:
        env, train = self.environment, self.data.train
        if env is None and train is None:
            raise _at("data.train", "required (or give spec.environment)")
        if env is not None and env.verifiers is not None and train is not None:
            raise _at(
                "data.train",
                "must be absent with environment.verifiers: the environment's dataset gives "
                "the prompts",
            )
        if env is not None and env.openenv is not None and train is None:
            raise _at("data.train", "required with environment.openenv: it gives the prompts")
        return self

    @model_validator(mode="after")
    def _colocated_is_one_process(self) -> RunSpec:
        if self.placement != "colocated":
            return self
        one = "must be 1 with placement colocated (one process holds the trainer and the engine)"
        for field, value in (
            ("trainers.replicas", self.trainers.replicas),
            ("generators.replicas", self.generators.replicas),
            ("generators.tensorParallel", self.generators.tensor_parallel),
        ):
            if value != 1:
                raise _at(field, f"{one}; got {value}")
        if self.trainers.gpus > 1:
            raise _at(
                "trainers.gpus",
                f"must be 0 or 1 with placement colocated; got {self.trainers.gpus}",
            )
        if self.generators.gpus != self.trainers.gpus:
            raise _at(
                "generators.gpus",
                f"must equal trainers.gpus ({self.trainers.gpus}) with placement colocated: the "
                f"engine shares the trainer's device; got {self.generators.gpus}",
            )
        return self

    @model_validator(mode="after")
    def _warmup_within_budget(self) -> RunSpec:
        optimizer, steps = self.recipe.optimizer, self.budget.max_steps
        if optimizer.warmup_steps <= steps:
            return self
        default = "" if "warmup_steps" in optimizer.model_fields_set else " (the default)"
        raise _at(
            "recipe.optimizer.warmupSteps",
            f"{optimizer.warmup_steps}{default} is more than budget.maxSteps {steps}: the "
            f"learning rate would still be rising when the run ends and never reach lr "
            f"{optimizer.lr:g}; set warmupSteps to {steps} or less",
        )

    @model_validator(mode="after")
    def _a_fit_can_be_made(self) -> RunSpec:
        """Refuse a compute floor or an evaluation schedule that leaves no fit possible: the
        run would train to its end and never say where it is heading."""
        floor, budget = self.fit.min_compute, self.budget
        if floor is not None and floor >= budget.max_compute_hours:
            raise _at(
                "fit.minCompute",
                f"must be below budget.maxComputeHours ({budget.max_compute_hours:g}): every "
                f"evaluation would lie below it and no fit could be made; got {floor:g}",
            )
        every = self.evaluation.every_steps
        count = len(evaluation_steps(budget.max_steps, every, self.recipe.steps_per_round))
        # A floor of 0 keeps the step-0 evaluation as a point; any other floor excludes it.
        needed = FIT_MIN_POINTS + (floor != 0)
        if count < needed:
            raise _at(
                "evaluation.everySteps",
                f"{every} gives {count} evaluations within budget.maxSteps {budget.max_steps} "
                f"(step 0, every {every} steps, the last step{_rounds(self.recipe)}); a fit "
                f"needs {needed} with "
                f"fit.minCompute {'null' if floor is None else f'{floor:g}'} (and a prediction "
                f"{PREDICTION_MIN_POINTS} past step 0): evaluate more often",
            )
        return self

    @property
    def colocated(self) -> bool:
        return self.placement == "colocated"

    @property
    def thinks(self) -> bool:
        return self.model.think_end is not None

    @property
    def interruption_phrase(self) -> str:
        phrase = self.recipe.length.interruption.phrase
        return phrase if phrase is not None else f"{INTERRUPTION_TEXT} {self.model.think_end}"

    @property
    def max_completion_tokens(self) -> int:
        """The completion budget: thinking + answer, or the answer alone without thinking."""
        length = self.recipe.length
        return length.max_completion_tokens if self.thinks else length.answer_budget

    @property
    def ranks_per_trainer(self) -> int:
        """Trainer ranks in one trainer replica on a cluster: one per GPU, one on CPU."""
        return max(1, self.trainers.gpus)

    @property
    def processes(self) -> int:
        """Processes (pods) of the run: a CPU run's compute units, in process-hours."""
        return 1 if self.colocated else self.trainers.replicas + self.generators.replicas

    @property
    def cluster_compute_units(self) -> int:
        """What compute counts, on a cluster and locally: GPUs, or processes for a CPU run."""
        return self.compute_units or self.processes

    @property
    def compute_unit(self) -> str:
        """The unit of this run's compute, as every line, column and axis names it."""
        return "GPU-hours" if self.compute_units else "process-hours"

    @property
    def compute_units(self) -> int:
        """GPUs of the whole run (generators + trainers); compute = wall hours x this."""
        if self.colocated:  # trainer and engine share one pod's devices
            return self.trainers.gpus
        return self.generators.replicas * self.generators.gpus + self.trainers.replicas * (
            self.trainers.gpus
        )


class ScaleRLRun(_Resource):
    kind: Literal["ScaleRLRun"]
    spec: RunSpec

    @model_validator(mode="after")
    def _name_is_dns_label(self) -> ScaleRLRun:
        name = self.metadata.name
        if len(name) > 63 or not _DNS_LABEL.match(name):
            raise ValueError(f"metadata.name {name!r} must be a DNS-1123 label (a-z, 0-9, '-')")
        return self

    @property
    def namespace(self) -> str:
        """metadata.namespace, or "local" for a run without one (a local run)."""
        return self.metadata.namespace or "local"

    @property
    def queue_name(self) -> str | None:
        """The Kueue LocalQueue the gang is admitted through: `spec.scheduling.queueName`, else
        the run's label kueue.x-k8s.io/queue-name; None: no queue (pods scheduled as they come)."""
        labels = (self.metadata.model_extra or {}).get("labels") or {}
        label = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
        return self.spec.scheduling.queue_name or (str(label) if label else None)


def parse_run(obj: Any) -> ScaleRLRun:
    """Validate a ScaleRLRun object (a dict as from YAML); SpecError lists every bad field."""
    if not isinstance(obj, dict):
        raise SpecError([f"a ScaleRLRun must be a mapping, got {type(obj).__name__}"])
    obj = {k: v for k, v in obj.items() if k != "status"}
    try:
        return ScaleRLRun.model_validate(obj)
    except ValidationError as err:
        raise SpecError(_problems(err, ScaleRLRun)) from None


def load_run(path: str | Path) -> ScaleRLRun:
    """Read and validate a YAML file holding one ScaleRLRun."""
    return _load(path, parse_run)
