"""A platform's VM definition read as iomatrix settings: per disk, the configuration and the QEMU
arguments it amounts to (vm: ``iomatrix translate``), and one disk of it as a suite's reference
configuration (fromvm: ``[matrix] from_vm``)."""
