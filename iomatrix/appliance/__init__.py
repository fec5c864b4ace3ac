"""The guest appliance: a kernel plus a tiny initramfs (busybox, the host's fio, the needed modules)."""
