"""Record readers: episode files and every recorded format -> role-tagged trajectories."""
