"""Alerts and the options of the training monitor (pydantic models, written as JSON lines)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AlertKind = Literal[
    "nonfinite", "loss_spike", "grad_norm_spike", "update_ratio_jump", "layer_grad_norm_jump"
]


class WatchOptions(BaseModel):
    """How the watch samples and when it alerts. Unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: int = Field(
        default=1000,
        ge=1,
        description="Record per-layer statistics (activations, gradients, parameters, "
        "optimizer state) of every N-th step, from step 0; between them only the per-step "
        "scalars are measured.",
    )
    window: int = Field(
        default=100, ge=3, description="Steps of history each robust z-score is taken over."
    )
    min_history: int = Field(
        default=10, ge=3, description="Steps of history a series needs before it can alert."
    )
    z_threshold: float = Field(
        default=6.0,
        gt=0,
        description="Alert when a value's robust z-score, (x - median) / (1.4826 MAD), "
        "exceeds this over its own history (loss linear; norms and ratios in log).",
    )
    on_alert: Literal["log", "record"] = Field(
        default="log",
        description="'log': log the alert and append it to alerts.jsonl; 'record': also "
        "record the next step in full (statistics and full tensors) for compare/replay.",
    )
    max_alert_records: int = Field(
        default=3, ge=0, description="With on_alert='record': at most this many full steps."
    )
    hashes: bool = Field(
        default=False,
        description="Recorded steps also carry a hash of every tensor's bits, for "
        "`precguard bitwise` between two runs that should be bitwise identical.",
    )


class LayerEvidence(BaseModel):
    """One layer (a parameter) an alert names, with its value and its own history."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    layer: str = Field(
        description="Qualified parameter name, e.g. model.layers.1.mlp.up_proj.weight."
    )
    module: str = Field(description="The module owning the parameter ('root' for the root).")
    value: float | None = Field(description="This step's value (NaN/Inf for a non-finite one).")
    median: float | None = Field(default=None, description="Median of its recent history.")
    z: float | None = Field(default=None, description="Robust z-score against that history.")


class Alert(BaseModel):
    """One anomaly: what, at which step, in which layers, with the evidence."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    schema_version: int = Field(default=1, description="Format version of an alert line.")
    kind: AlertKind = Field(
        description="nonfinite: the first NaN/Inf (loss, a gradient, an update); loss_spike; "
        "grad_norm_spike (global norm); update_ratio_jump and layer_grad_norm_jump: layers "
        "whose update/param ratio or gradient norm left their own history."
    )
    step: int = Field(description="The training step (0-based, counted by watch.step()).")
    message: str = Field(description="One line saying what happened and where.")
    layers: list[LayerEvidence] = Field(
        default_factory=list, description="The layers involved, in the model's parameter order."
    )
    value: float | None = Field(default=None, description="The global value (loss, grad norm).")
    median: float | None = Field(default=None, description="Its recent median.")
    z: float | None = Field(default=None, description="Its robust z-score.")
    recorded_step: int | None = Field(
        default=None,
        description="The step recorded in full because of this alert (on_alert='record').",
    )
