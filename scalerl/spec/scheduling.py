"""Where pods run on a cluster: the core/v1 scheduling fields (tolerations, affinity, node
selectors, classes), typed so that the CRD validates them, and the run's Kueue queue."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from scalerl.spec.base import _DNS_LABEL, Int, _at, _Model

# A DNS-1123 subdomain: the names of PriorityClasses, RuntimeClasses and schedulers.
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_KEY = (  # an optional DNS-subdomain prefix and "/", then a name of up to 63 characters
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LabelKey = Annotated[str, Field(min_length=1, max_length=316, pattern=_LABEL_KEY)]
ClassName = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)]
# The weight of a preferred term: 1-100.
Weight = Annotated[int, Field(strict=True, ge=1, le=100)]


class Toleration(_Model):
    """Lets the pods onto nodes with a matching taint (a GPU pool's `nvidia.com/gpu:NoSchedule`)."""

    key: LabelKey | None = Field(None, description="Taint key; absent: every taint (Exists).")
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="Equal: the taint's value must match; Exists: any value."
    )
    value: str | None = Field(None, max_length=63, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; absent: every effect."
    )
    toleration_seconds: Int | None = Field(
        None, ge=0, le=10**9, description="NoExecute only: how long the pod stays once tainted."
    )

    @model_validator(mode="after")
    def _as_kubernetes_checks(self) -> Toleration:
        # The API server's own rules for a pod's tolerations: a Job whose pods break them
        # would only fail to create its pods.
        if self.key is None and self.operator != "Exists":
            raise _at("operator", "must be Exists when key is absent (a toleration of every taint)")
        if self.operator == "Exists" and self.value:
            raise _at("value", "must be absent with operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise _at("tolerationSeconds", "applies only to effect NoExecute")
        return self


class NodeSelectorRequirement(_Model):
    """A node label (or field) and the values it must or must not hold."""

    key: LabelKey = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the label relates to the values."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="The values: some for In and NotIn, none for Exists and DoesNotExist, "
        "one integer for Gt and Lt.",
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> NodeSelectorRequirement:
        need = {"In": "some", "NotIn": "some", "Exists": "none", "DoesNotExist": "none"}
        wanted = need.get(self.operator, "one")  # Gt, Lt: one integer
        if (wanted == "some" and not self.values) or (wanted == "none" and self.values):
            raise _at(
                "values",
                f"{'required' if wanted == 'some' else 'must be empty'} "
                f"with operator {self.operator}",
            )
        if wanted == "one" and (len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()):
            raise _at("values", f"must be one integer with operator {self.operator}")
        return self


class LabelSelectorRequirement(_Model):
    """A label and the values it must or must not hold."""

    key: LabelKey = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label relates to the values."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="The values: some for In and NotIn, none for Exists and DoesNotExist.",
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise _at(
                "values",
                f"{'required' if self.operator in ('In', 'NotIn') else 'must be empty'} "
                f"with operator {self.operator}",
            )
        return self


class LabelSelector(_Model):
    """A label query (Kubernetes' LabelSelector): matchLabels and matchExpressions, ANDed."""

    match_labels: dict[LabelKey, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, description="Labels the resource must have, key: value."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Label requirements, ANDed."
    )


class NodeSelectorTerm(_Model):
    """Node requirements, ANDed (Kubernetes' NodeSelectorTerm)."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list)


class NodeSelector(_Model):
    """Nodes that match any one of the terms (Kubernetes' NodeSelector)."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=100)


class PreferredSchedulingTerm(_Model):
    """A node preference and its weight (Kubernetes' PreferredSchedulingTerm)."""

    weight: Weight = Field(description="Added to a matching node's score (1-100).")
    preference: NodeSelectorTerm


class NodeAffinity(_Model):
    """Which nodes the pods may or prefer to run on (Kubernetes' NodeAffinity)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list
    )


class PodAffinityTerm(_Model):
    """The pods to run near (or away from), within a topology domain (PodAffinityTerm)."""

    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces of the pods selected; empty without namespaceSelector: the "
        "run's own.",
    )
    topology_key: LabelKey = Field(
        description="Node label whose value is the domain (kubernetes.io/hostname: one node)."
    )


class WeightedPodAffinityTerm(_Model):
    """A pod affinity term and its weight (Kubernetes' WeightedPodAffinityTerm)."""

    weight: Weight = Field(description="Added to a matching node's score (1-100).")
    pod_affinity_term: PodAffinityTerm


class PodAffinity(_Model):
    """Run near (podAffinity) or away from (podAntiAffinity) other pods (PodAffinity)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list
    )


class Affinity(_Model):
    """The pods' affinity, as core/v1 Affinity has it (pod terms: labelSelector, namespaces,
    namespaceSelector, topologyKey)."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class SchedulingSpec(_Model):
    """Where pods may run on a cluster: the core/v1 PodSpec fields of the same names. Every field
    is absent by default; in `trainers.scheduling` or `generators.scheduling` a field that is
    present replaces the run-wide `scheduling`'s (whole: two lists of tolerations are not
    merged)."""

    node_selector: dict[LabelKey, Annotated[str, Field(max_length=63)]] | None = Field(
        None, description="Node labels the pods need (e.g. a GPU type)."
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=100, description="Taints the pods tolerate (tainted GPU pools)."
    )
    affinity: Affinity | None = None
    priority_class_name: ClassName | None = Field(
        None, description="A PriorityClass (e.g. one that protects a gang from preemption)."
    )
    runtime_class_name: ClassName | None = Field(
        None, description="A RuntimeClass (k3s and RKE2 expose GPUs through 'nvidia')."
    )
    scheduler_name: ClassName | None = Field(
        None, description="A scheduler other than the default."
    )

    def over(self, default: SchedulingSpec) -> SchedulingSpec:
        """These fields where present, `default`'s elsewhere (the pod fields only: a run's
        queue is the gang's, not a pod's)."""
        return SchedulingSpec.model_construct(
            **{
                k: getattr(self, k) if getattr(self, k) is not None else getattr(default, k)
                for k in SchedulingSpec.model_fields
            }
        )

    def pod_fields(self) -> dict[str, Any]:
        """The PodSpec fields these set (camelCase, absent ones left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# The label by which Kueue knows a workload's LocalQueue; on a run, it names the run's queue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QueueName = Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL.pattern)]


class RunSchedulingSpec(SchedulingSpec):
    """The whole run's scheduling: the pod fields, and the queue its gang is admitted through."""

    queue_name: QueueName | None = Field(
        None,
        description="A Kueue LocalQueue in the run's namespace: the gang (every trainer and "
        "generator pod) is one Kueue workload, admitted all at once or not at all. Needs Kueue "
        f"with its JobSet integration, and JobSet. The run's label {QUEUE_LABEL} does the same.",
    )
