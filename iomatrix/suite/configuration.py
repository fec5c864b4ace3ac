"""A configuration: one point of the disk matrix as measured, and its key."""

from __future__ import annotations

from iomatrix.core.model import Frozen, shown
from iomatrix.suite.fields import NODE_AXIS, TARGET_AXIS, YOUR_VM
from iomatrix.vocab.axes import AXES, BY_NAME, CONFIG_AXES, CORE, AxisLevels
from iomatrix.vocab.words import Mode


class ConfigKey(Frozen):
    """A configuration's identity, typed: its mode and the settings that tell it apart
    (``Configuration.params``, in that order). ``str(key)`` is the text runs store and are
    compared, resumed and reported by (``blocklayer/aio=native/cache=none/...``): it is
    written, never read back into parts."""

    mode: str
    params: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return "/".join([self.mode, *(f"{k}={v}" for k, v in self.params)])

    @property
    def settings(self) -> str:
        """The key without its mode: ``aio=native/cache=none/...``."""
        return str(self).partition("/")[2]

    @property
    def target(self) -> str | None:
        """The target's name in a run that measures several; None in a run of one."""
        return dict(self.params).get(TARGET_AXIS)

    @property
    def baseline(self) -> "ConfigKey":
        """The bare-metal baseline this configuration is measured against: the host-mode
        configuration on the same target (``host``, or ``host/target=NAME``)."""
        target = self.target
        return ConfigKey(mode=Mode.HOST, params=() if target is None else ((TARGET_AXIS, target),))


class Configuration(AxisLevels):
    """One point of the disk matrix: a level (or None) for each axis of ``iomatrix.vocab.axes``
    (data_path None: QEMU's device model; guest None: the appliance, in a run whose matrix names
    no guest), its mode, and what places it in the run. Fields that the mode ignores are None."""

    mode: Mode
    aa: bool | None = None
    """True: the A/A twin of the configuration with the same settings (``[method] aa``): measured
    again under its own key (``.../aa=twin``) in the same rounds, never compared with others."""
    yours: bool | None = None
    """True: the disk of the user's VM (``[matrix] from_vm``), the configuration ``recommend``
    answers relative to. Not part of the key: a matrix configuration with the same settings is
    the same point, labelled as the VM's."""
    target: str | None = None
    """The target's name in a run that measures several (``Suite.named_targets``); None when
    the run has one target."""
    node: str | None = None
    """The node that measures it in a run of a cluster's nodes ([nodes]); None on one host."""

    def params(self) -> dict[str, str]:
        """Axis → value for the axes this configuration sets, in a stable order (the node, then
        the target where the run has several; an A/A twin adds aa = twin)."""
        out: dict[str, str] = {}
        if self.node is not None:
            out[NODE_AXIS] = self.node
        if self.target is not None:
            out[TARGET_AXIS] = self.target
        for axis in CONFIG_AXES:
            value = getattr(self, axis)
            if value is not None:
                out[axis] = shown(value)
        if self.aa:
            out["aa"] = "twin"
        return out

    @property
    def identity(self) -> ConfigKey:
        """Its key, typed."""
        return ConfigKey(mode=self.mode, params=tuple(self.params().items()))

    @property
    def key(self) -> str:
        """Stable identity, e.g. ``blocklayer/aio=native/cache=none/format=raw/...``."""
        return str(self.identity)

    @property
    def label(self) -> str:
        """Short legend text: ``blocklayer native/none/raw`` (+ ``iothread``, ``prealloc=...``,
        `` on TARGET``)."""
        where = "" if self.target is None else f" on {self.target}"
        if self.node is not None:
            where += f" @{self.node}"
        # outside a guest, fio itself runs where vcpu_affinity says (its cpus_allowed)
        fio = "" if self.mode == Mode.GUEST or self.vcpu_affinity is None else (
            f" fio@{self.vcpu_affinity}")
        if self.mode == Mode.HOST:
            return "host (bare metal)" + fio + BY_NAME["node_count"].shown_in_label(
                self.node_count) + where
        device = "vhost-user-blk" if self.data_path == "vhost-user-blk" else self.controller
        core = [device, *(getattr(self, a.name) for a in AXES
                          if a.label == CORE and a.name not in ("controller", "data_path"))]
        text = f"{self.mode} " + "/".join(v for v in core if v is not None)
        text += "".join(a.shown_in_label(getattr(self, a.name)) for a in AXES
                        if fio == "" or a.name != "vcpu_affinity") + fio
        text += where
        if self.aa:
            text += " (A/A twin)"
        if self.yours:
            text += f" {YOUR_VM}"
        return text
