"""The ground every step stands on: errors, units, typed models, processes and mounts."""
