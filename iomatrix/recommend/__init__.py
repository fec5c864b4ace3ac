"""Recommendations: a stored run → the disk settings to use on Proxmox VE, libvirt or QEMU, each
with its measured evidence, and the text to paste (``qm set``, domain XML, QEMU arguments).

- ``defaults``: what each platform does by default and accepts (from the reference notes).
- ``decide``: the decision rule, over :mod:`iomatrix.analysis.effects` (pure).
- ``render``: a recommended configuration as each platform takes it (pure).
"""

# The command line imports ``defaults`` alone at start-up; ``decide`` (and with it scipy) loads
# when a recommendation is asked for: import from the submodules.
