"""iomatrix: which virtual-disk settings should this QEMU/KVM host use, and how sure are we."""

__version__ = "0.1.0"
