"""``iomatrix recommend RUN --for proxmox|libvirt|qemu``: the settings to use, with evidence."""
