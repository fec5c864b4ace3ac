"""guest mode: VMs booted per configuration, fio's server inside each, the host's fio as client.

One module per seam:

* ``driver``: :class:`GuestDriver`, a configuration's guests booted (and the private channel
  to them); ``accel``: KVM or TCG;
* ``session``: :class:`GuestSession`, the booted guests as the runner drives them;
* ``iocheck``: the foreign-I/O check of each trial;
* ``kind`` and ``kinds``: what boots in a guest, behind one interface (``GuestKind``), and the
  registry of kinds: the appliance (``appliance``) and the user's own image (``image``).
"""

from iomatrix.drivers.guest.accel import resolve_accel
from iomatrix.drivers.guest.driver import GuestDriver, shared_warning
from iomatrix.drivers.guest.session import PRIVATE, SHARED, Guest, GuestSession, free_port

__all__ = ["PRIVATE", "SHARED", "Guest", "GuestDriver", "GuestSession", "free_port",
           "resolve_accel", "shared_warning"]
