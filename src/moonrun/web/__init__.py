"""The crystal-moonlight console, served by the platform under `/`; it renders what the use
cases answer and never reaches the store itself."""
