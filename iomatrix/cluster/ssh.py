"""The nodes of a cluster and how OpenSSH reaches them: the ``Node`` model, the three ways to name
nodes (an SSH host list, a TOML inventory, a Proxmox VE cluster's ``/etc/pve/.members``) and the
``ssh`` argv for a command on a node.

The transport is the user's OpenSSH, with their keys and ``~/.ssh/config`` (ProxyJump, aliases),
under options that make it fit for unattended runs: ``BatchMode`` (no prompt ever waits for a
person), ``StrictHostKeyChecking=yes`` against the user's known_hosts (an unknown or changed host
key refuses the node; it is never accepted silently), ``ConnectTimeout`` (a node that does not
answer is refused within seconds) and ``ServerAliveInterval`` (a node that drops mid-run is noticed
within interval × count seconds, and its session ends).

What reaches ssh is held to rule 1 (``iomatrix.core.trust``): a suite or a database row never
names an ssh_config file or the program a node runs (``untrusted``), an inventory does only when
nobody but the invoking user could have written it (``load_inventory``), and every identity,
known_hosts and ssh_config file passes ``chosen_by_us`` before ssh starts (``check_files``)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from iomatrix.core.errors import NodesError
from iomatrix.core.trust import UntrustedFile, chosen_by_us, read_authored

PVE_MEMBERS = Path("/etc/pve/.members")
"""pmxcfs's view of a Proxmox VE cluster: JSON made by ``cfs_create_memberlist_msg``
(pve-cluster's src/pmxcfs/status.c), with each node's id, online flag and address."""

PVE_NODES = Path("/etc/pve/nodes")
"""Per-node directories; PVE 8.1+ keeps each node's host key in ``NODE/ssh_known_hosts``."""

CONNECT_TIMEOUT = 10
"""Seconds for SSH to reach a node and log in before it is refused."""

ALIVE_INTERVAL, ALIVE_COUNT = 5, 3
"""A node that answers no keepalive for 5 s × 3 is dropped: its session ends, its trials fail
(the interval is a node's ``alive_interval``)."""
MAX_ALIVE_INTERVAL = 3600

DEFAULT_COMMAND = "iomatrix"
"""The iomatrix a node runs, found on the login PATH, unless a node says where it is."""

MAX_TEXT = 4096
"""The longest value a node's field may hold (a path's PATH_MAX)."""
MAX_INVENTORY_BYTES = 1 << 20
"""The largest inventory file read."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SSH_SYNTAX = re.compile(r"[\s%$\"'\\]")
"""What ssh reads as syntax in a file's name (``-i``, ``-F``, ``-o UserKnownHostsFile=``): a
blank separates files, ``%x`` and ``${VAR}`` expand, quotes and ``\\`` escape."""
OWN_KEYS = ("ssh_config", "command", "user")
"""What only the invoking user's own configuration names (``untrusted``): ssh runs what an
ssh_config says (ProxyCommand, LocalCommand, Match exec), ``command`` is what runs on every
node, and ``user`` the account the user's key logs in to there (another user's own account on
a node, whose shell would answer for iomatrix, unless it is root or the user's own)."""


@dataclass(frozen=True)
class Node:
    """One node: where SSH reaches it and as whom. Unset fields are left to the user's SSH
    configuration (``~/.ssh/config``, ``ssh_config``)."""

    host: str
    """Host name or address (or an alias of the user's ssh_config)."""
    name: str = ""
    """What results call the node (the ``node`` axis); the host when not given."""
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    """Private key file (``ssh -i``); only that key is offered (IdentitiesOnly)."""
    known_hosts: str | None = None
    """The only known_hosts file trusted for this node; else the user's and the system's."""
    host_key_alias: str | None = None
    """The name its host key is recorded under (Proxmox VE records node names, not addresses)."""
    ssh_config: str | None = None
    """An ssh_config file instead of ``~/.ssh/config`` (``ssh -F``)."""
    command: str = DEFAULT_COMMAND
    """The iomatrix program on the node."""
    alive_interval: int = ALIVE_INTERVAL
    """Seconds between SSH's keepalives (``ServerAliveInterval``): a node that answers none of
    ``ALIVE_COUNT`` in a row is dropped."""

    @property
    def label(self) -> str:
        return self.name or self.host

    def destination(self) -> str:
        """``[user@]host[:port]`` as a person would write it."""
        where = f"[{self.host}]" if ":" in self.host and self.port else self.host
        return (f"{self.user}@" if self.user else "") + where + (f":{self.port}" if self.port else "")


LENT_NOTHING = ("-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "PermitLocalCommand=no",
                "-o", "Tunnel=no")
"""ssh's options that keep the user's agent, display, local commands and tunnel devices from a
node (``ssh_argv``)."""
FORWARDS = frozenset({"-L", "-R", "-D"})
"""ssh's options that forward a port or socket: with one, ClearAllForwardings is not set (it
would clear that forward too)."""


def ssh_argv(node: Node, command: Sequence[str], *, connect_timeout: int = CONNECT_TIMEOUT,
             alive_count: int = ALIVE_COUNT, ssh: str = "ssh",
             options: Sequence[str] = ()) -> list[str]:
    """The OpenSSH argv that runs ``command`` (an argv, quoted here for the node's login shell)
    on ``node``, with no terminal and no escape character (the session carries data on stdin).
    ``options``: more of ssh's own (a forward: ``-L``).

    Nothing of the user's own is lent to the node, whatever their ssh_config says (a suite may
    have chosen the node): no agent, no X11 display, no local command, no tunnel device, and
    (unless ``options`` forward a socket, which ClearAllForwardings would clear as well) no
    forward the configuration sets up. ssh takes the first value it reads of an option, and
    the command line's come first."""
    argv = [ssh]
    if node.ssh_config:
        argv += ["-F", node.ssh_config]
    argv += ["-T", "-e", "none",
             "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=yes",
             "-o", f"ConnectTimeout={connect_timeout}",
             "-o", f"ServerAliveInterval={node.alive_interval}",
             "-o", f"ServerAliveCountMax={alive_count}",
             *LENT_NOTHING]
    if not FORWARDS.intersection(options):
        argv += ["-o", "ClearAllForwardings=yes"]
    if node.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={node.known_hosts}", "-o", "GlobalKnownHostsFile=none"]
    if node.host_key_alias:
        argv += ["-o", f"HostKeyAlias={node.host_key_alias}"]
    if node.identity:
        argv += ["-i", node.identity, "-o", "IdentitiesOnly=yes"]
    if node.user:
        argv += ["-l", node.user]
    if node.port:
        argv += ["-p", str(node.port)]
    return [*argv, *options, "--", node.host, " ".join(shlex.quote(word) for word in command)]


# --- naming nodes ----------------------------------------------------------------------------

_DESTINATION = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%[\w.-]+)?)\]|(?P<host>[^@:\s\[\]]+))"
                          r"(?::(?P<port>\d{1,5}))?$")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
NODE_KEYS = {f.name for f in fields(Node)}
DEFAULT_KEYS = NODE_KEYS - {"host", "name", "host_key_alias"}
"""Keys a list of nodes may set once for all of them."""


def parse_destination(text: str, defaults: Mapping[str, Any] | None = None) -> Node:
    """One node from ``[user@]host[:port]`` (an IPv6 address in brackets), over ``defaults``."""
    why = text_problem(text)
    if why:
        raise NodesError(f"node {shown(text)}: {why}")
    match = _DESTINATION.match(text.strip())
    if not match:
        raise NodesError(f"node {text.strip()!r}: not [user@]host[:port]")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise NodesError(f"node {text.strip()!r}: port {port} is not 1-65535")
    given: dict[str, str | int] = {"host": match["v6"] or match["host"]}
    if match["user"]:
        given["user"] = match["user"]
    if port:
        given["port"] = port
    return _node({**(defaults or {}), **given}, text.strip())


def parse_host_list(text: str, defaults: Mapping[str, Any] | None = None) -> tuple[Node, ...]:
    """Nodes from a comma- or space-separated list of ``[user@]host[:port]``."""
    words = [w for w in re.split(r"[,\s]+", text) if w]
    if not words:
        raise NodesError("no nodes in the host list")
    return _unique(tuple(parse_destination(w, defaults) for w in words))


def parse_inventory(data: Mapping[str, Any], where: str, *, base: Path | None = None) -> tuple[Node, ...]:
    """Nodes from an inventory table: ``hosts = [...]`` (destinations) and/or ``[[node]]`` tables
    (``host`` and the other ``Node`` fields), with the keys of ``DEFAULT_KEYS`` at the top as
    defaults for all. Relative files (identity, known_hosts, ssh_config) are relative to ``base``."""
    unknown = set(data) - DEFAULT_KEYS - {"hosts", "node"}
    if unknown:
        raise NodesError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: "
                         f"{', '.join(sorted(DEFAULT_KEYS | {'hosts', 'node'}))})")
    defaults = _checked({k: v for k, v in data.items() if k in DEFAULT_KEYS}, where)
    hosts = data.get("hosts", [])
    tables = data.get("node", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise NodesError(f"{where}: hosts must be a list of \"[user@]host[:port]\" strings")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise NodesError(f"{where}: node must be [[node]] tables")
    nodes = [parse_destination(h, defaults) for h in hosts]
    for i, table in enumerate(tables, 1):
        at = f"{where}: node {i}"
        unknown = set(table) - NODE_KEYS
        if unknown:
            raise NodesError(f"{at}: unknown key {sorted(unknown)[0]!r} (known: "
                             f"{', '.join(sorted(NODE_KEYS))})")
        if "host" not in table:
            raise NodesError(f"{at}: no host")
        nodes.append(_node({**defaults, **_checked(table, at)}, at))
    if not nodes:
        raise NodesError(f"{where}: no nodes (give hosts = [...] or [[node]] tables)")
    return _unique(tuple(_relative(n, base) for n in nodes))


def load_inventory(path: Path) -> tuple[Node, ...]:
    """Nodes from a TOML inventory file (``parse_inventory``). Only an inventory that nobody but
    the invoking user could have written (its author: the user's own configuration) may name
    an ssh_config or the nodes' command (``untrusted``). It is read once, a regular file of at
    most ``MAX_INVENTORY_BYTES``, and judged from the descriptor read (``read_authored``)."""
    raw, author = read_authored(path, f"inventory {path}", max_bytes=MAX_INVENTORY_BYTES,
                                error=lambda why: NodesError(f"cannot read the inventory {path}: "
                                                             f"{why}"))
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:     # TOMLDecodeError, UnicodeDecodeError too
        raise NodesError(f"{path}: not TOML: {exc}") from None
    nodes = parse_inventory(data, str(path), base=path.parent)
    if author.trusted:
        return nodes
    return tuple(untrusted(n, f"inventory {path} (another user could write it): node {n.label}")
                 for n in nodes)


def parse_pve_members(text: str, *, nodes_dir: Path = PVE_NODES,
                      defaults: Mapping[str, Any] | None = None) -> tuple[Node, ...]:
    """Every node of a Proxmox VE cluster from the text of ``/etc/pve/.members``: reached as root
    at its cluster address, its host key checked under its node name in the cluster's own
    known_hosts (as Proxmox's SSHInfo.pm does). NodesError for a node the cluster sees offline
    or without an address, and for a host that is no cluster (a lone node's file has no list)."""
    try:
        members = json.loads(text)
    except ValueError as exc:
        raise NodesError(f"{PVE_MEMBERS}: not the JSON pmxcfs writes: {exc}") from exc
    nodelist = members.get("nodelist") if isinstance(members, dict) else None
    if not isinstance(nodelist, dict) or not nodelist:
        raise NodesError(f"{PVE_MEMBERS} lists no cluster nodes: this Proxmox VE host is not in "
                         "a cluster", hint="name the nodes with --nodes host1,host2,...")
    problems, nodes = [], []
    for name, info in sorted(nodelist.items(), key=lambda item: _pve_id(item[1])):
        if not isinstance(info, dict) or not info.get("online"):
            problems.append(f"node {name}: offline in the Proxmox VE cluster ({PVE_MEMBERS})")
        elif not info.get("ip"):
            problems.append(f"node {name}: no address in {PVE_MEMBERS}")
        else:
            known = nodes_dir / name / "ssh_known_hosts"
            nodes.append(_node({"user": "root", **(defaults or {}), "host": info["ip"],
                                "name": name, "host_key_alias": name,
                                "known_hosts": str(known) if known.is_file() else None}, name))
    if problems:
        raise NodesError("\n".join(problems), hint="bring the nodes up, or name the nodes to "
                                                   "use with --nodes host1,host2,...")
    return tuple(nodes)


def read_pve_members(path: Path = PVE_MEMBERS) -> tuple[Node, ...]:
    """``parse_pve_members`` of this Proxmox VE host's ``/etc/pve/.members``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise NodesError(f"cannot read {path}: {exc.strerror or exc} (is this a Proxmox VE node "
                         "with pve-cluster running?)") from exc
    return parse_pve_members(text, nodes_dir=path.parent / "nodes")


def resolve(spec: str, *, base: Path | None = None) -> tuple[Node, ...]:
    """The nodes ``--nodes`` names: ``pve`` (this Proxmox VE cluster), a TOML inventory file
    (a path ending in .toml, or any existing file), or a list of ``[user@]host[:port]``."""
    text = spec.strip()
    if text == "pve":
        return read_pve_members()
    path = Path(os.path.expanduser(text))
    if base is not None and not path.is_absolute():
        path = base / path
    if text.endswith(".toml") or (os.sep in text and path.is_file()):
        return load_inventory(path)
    return parse_host_list(text)


def _pve_id(info: object) -> int:
    return info.get("id", 0) if isinstance(info, dict) and isinstance(info.get("id"), int) else 0


# --- what reaches ssh ----------------------------------------------------------------------------

def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be a node's field (a host, a user, a file, a command): a control
    character (a NUL ends an argv word) or more than ``MAX_TEXT`` characters; None if it can."""
    if len(value) > MAX_TEXT:
        return f"is longer than {MAX_TEXT} characters"
    if _CONTROL.search(value):
        return "holds a control character"
    return None


def shown(text: str) -> str:
    """``text`` as a refusal quotes it: escaped, and cut short."""
    return repr(text[:60]) + ("..." if len(text) > 60 else "")


def untrusted(node: Node, where: str) -> Node:
    """``node`` as read from input another user may have written (an inventory they could write,
    a row of a store, a suite's [nodes]): UntrustedFile when it names what only the invoking
    user's own configuration may (``OWN_KEYS``): an ssh_config file (``none``, no file at all,
    aside), a command other than iomatrix on the login PATH, or a user to log in as other than
    root or the invoking user (``own_users``). ``where`` names the input and the node."""
    why = {"ssh_config": "ssh would run what that file says (ProxyCommand, LocalCommand, "
                         "Match exec)",
           "command": "it is the program every node runs",
           "user": "your key would log in to that account, whose owner's shell would answer "
                   "in iomatrix's place"}
    for key, value in (("ssh_config", node.ssh_config if node.ssh_config != "none" else None),
                       ("command", node.command if node.command != DEFAULT_COMMAND else None),
                       ("user", node.user if node.user not in own_users() else None)):
        if value is not None:
            raise UntrustedFile(f"{where}: {key} {shown(value)}: {why[key]}; only your own "
                                "inventory may name it",
                                hint="give it in an inventory only root (or you) can write: "
                                     "--nodes FILE")
    return node


def own_users() -> tuple[str | None, ...]:
    """The accounts input another user wrote may have a node log in as (``untrusted``): none
    named (the user's own ssh configuration decides), root, and the invoking user."""
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        me = None
    return (None, "root", me)


def check_files(node: Node) -> None:
    """Rule 1 for the files ssh reads for ``node`` (identity, known_hosts, ssh_config), before
    ssh starts: each nobody but the invoking user could have chosen (``chosen_by_us``), so a
    known_hosts holding another user's own sshd's key is refused; and none that ssh would read
    as more than a name (``_SSH_SYNTAX``). UntrustedFile in one line naming the key."""
    for key in ("identity", "known_hosts", "ssh_config"):
        value = getattr(node, key)
        if value is None or (key == "ssh_config" and value == "none"):
            continue
        named = f"[nodes] {key} (node {node.label})"
        if _SSH_SYNTAX.search(value):
            raise UntrustedFile(f"{named}: {shown(value)}: ssh reads a blank, '%', '$', quotes "
                                "or '\\' in a file's name as syntax")
        chosen_by_us(value, named, "ssh")


def check_nodes(nodes: Sequence[Node]) -> tuple[Node, ...]:
    """``nodes``, once the files of each pass ``check_files``."""
    for node in nodes:
        check_files(node)
    return tuple(nodes)


def stored_node(fields: object, name: str, where: str) -> Node:
    """The node ``name`` of a stored cluster run from its row's ``fields`` (``Node``'s fields),
    read as untrusted input: the types and values an inventory's node must have, and nothing
    only the user's own configuration may name (``untrusted``). NodesError or UntrustedFile in
    one line naming ``where`` (the row). ``fields`` may be a model the store read them into."""
    dump = getattr(fields, "model_dump", None)
    if callable(dump):
        fields = dump()
    if not isinstance(fields, Mapping) or not all(isinstance(k, str) for k in fields):
        raise NodesError(f"{where}: not a table of a node's fields")
    values = {k: v for k, v in fields.items() if v is not None}
    unknown = set(values) - NODE_KEYS
    if unknown:
        raise NodesError(f"{where}: unknown key {shown(sorted(unknown)[0])}")
    if "host" not in values:
        raise NodesError(f"{where}: no host")
    node = _node(_checked(values, where), where)
    if node.label != name:
        raise NodesError(f"{where}: its fields name node {shown(node.label)}")
    return untrusted(node, where)


_TYPES: dict[str, tuple[type, ...]] = {"port": (int,), "alive_interval": (int,)}


def _checked(table: Mapping[str, object], where: str) -> dict[str, str | int]:
    """A stored node's fields, each of the type a ``Node`` field has (a port and an
    alive_interval integers in their ranges, the others non-empty text); NodesError naming
    ``where`` for the first that is not."""
    out: dict[str, str | int] = {}
    for key, value in table.items():
        wanted = _TYPES.get(key, (str,))
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise NodesError(f"{where}: {key} must be {'an integer' if int in wanted else 'a string'},"
                             f" not {repr(value)[:60]}")
        if key == "port" and not 0 < value < 65536:
            raise NodesError(f"{where}: port {value} is not 1-65535")
        if key == "alive_interval" and not 0 < value <= MAX_ALIVE_INTERVAL:
            raise NodesError(f"{where}: alive_interval {value} is not 1-{MAX_ALIVE_INTERVAL}")
        if isinstance(value, str) and not value.strip():
            raise NodesError(f"{where}: {key} is empty")
        out[key] = value     # type: ignore[assignment]  # a str or an int: checked above
    return out


def _node(values: Mapping[str, Any], where: str) -> Node:
    for key, value in values.items():
        why = text_problem(value) if isinstance(value, str) else None
        if why:
            raise NodesError(f"node {where}: {key} {why}")
    host = values.get("host", "")
    if not host or host.startswith("-"):           # "-oProxyCommand=..." is an option to ssh
        raise NodesError(f"node {where}: host {host!r} is not a host name or address")
    name = values.get("name") or ""
    if name and not NODE_NAME.match(name):
        raise NodesError(f"node {where}: name {name!r} is not letters, digits, '.', '_' or '-'")
    return Node(**{k: v for k, v in values.items() if v is not None})


def _relative(node: Node, base: Path | None) -> Node:
    if base is None:
        return node
    files = {}
    for key in ("identity", "known_hosts", "ssh_config"):
        value = getattr(node, key)
        if value and value != "none":
            path = Path(os.path.expanduser(value))
            files[key] = str(path if path.is_absolute() else base / path)
    return replace(node, **files)


def _unique(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    seen: set[str] = set()
    for node in nodes:
        if node.label in seen:
            raise NodesError(f"node {node.label} is named twice (give each a distinct name)")
        seen.add(node.label)
    return nodes
