"""[nodes]: the cluster nodes that each measure a suite, and what SSH needs for them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from iomatrix.cluster.ssh import MAX_ALIVE_INTERVAL, parse_destination, text_problem
from iomatrix.core.errors import NodesError
from iomatrix.core.model import Frozen


class Nodes(Frozen):
    """[nodes]: the nodes that each measure the suite, named one way (``hosts``, an
    ``inventory`` file, or this Proxmox VE cluster's members), with what SSH needs for all of
    them (``iomatrix.cluster.ssh``)."""

    hosts: tuple[str, ...] = ()
    """``[user@]host[:port]`` of each node."""
    inventory: str | None = None
    """A TOML inventory file (``hosts = [...]`` and/or ``[[node]]`` tables), relative to the suite."""
    proxmox: bool = False
    """Every node of the Proxmox VE cluster this host is in (``/etc/pve/.members``)."""
    user: str | None = None
    """The user SSH logs in as on every node (``user@`` in ``hosts`` wins)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """SSH's port on every node (``:port`` in ``hosts`` wins)."""
    identity: str | None = None
    """The private key SSH uses (rule 1: only a file nobody but root or the user could have
    written)."""
    known_hosts: str | None = None
    """The known_hosts file with every node's host key; absent: the user's and the
    system's. An unknown or changed key refuses the node."""
    ssh_config: str | None = None
    """Refused: a suite never hands ssh a config file (root's ssh would run its ProxyCommand)."""
    command: str | None = None
    """Refused: the program a node runs is iomatrix on its login PATH, or what root's own
    inventory says (``iomatrix.cluster.ssh.untrusted``), never a suite's string."""
    alive_interval: int | None = Field(default=None, ge=1, le=MAX_ALIVE_INTERVAL)
    """Seconds between SSH's keepalives to every node (default 5): a node that answers none
    of 3 in a row is dropped (its unmeasured trials fail, or with ``on_node_failure = "stop"``
    every node stops). An inventory sets it for its own nodes."""

    @field_validator("hosts", "inventory", "user", "identity", "known_hosts")
    @classmethod
    def _text(cls, value: Any) -> Any:
        for text in value if isinstance(value, tuple) else (value,):
            why = text_problem(text) if isinstance(text, str) else None
            if why:
                raise ValueError(why)
        return value

    @field_validator("ssh_config", "command")
    @classmethod
    def _own(cls, value: str | None, info: ValidationInfo) -> None:
        if value is not None:
            what = ("an ssh_config file (ssh would run its ProxyCommand)"
                    if info.field_name == "ssh_config" else "the program the nodes run")
            raise ValueError(f"a suite never names {what}: give it in an inventory only root "
                             "(or you) can write (--nodes FILE, or [nodes] inventory)")
        return None

    @model_validator(mode="after")
    def _one_way(self) -> "Nodes":
        ways = [w for w, given in (("hosts", bool(self.hosts)), ("inventory", self.inventory),
                                   ("proxmox", self.proxmox)) if given]
        if len(ways) != 1:
            raise ValueError("name the nodes one way: hosts = [...], inventory = \"FILE\" or "
                             "proxmox = true" + (f" (not {' and '.join(ways)})" if ways else ""))
        for host in self.hosts:
            try:
                parse_destination(host)
            except NodesError as exc:
                raise ValueError(str(exc)) from None
        return self

    def defaults(self) -> dict[str, Any]:
        """What the table sets for every node (``iomatrix.cluster.ssh.DEFAULT_KEYS``)."""
        return {k: v for k in ("user", "port", "identity", "known_hosts", "alive_interval")
                if (v := getattr(self, k)) is not None}
