"""platform_web: the crystal-moonlight console, served by the platform under `/`."""
