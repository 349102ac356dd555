"""Suite configuration: the typed, frozen settings and the TOML loader that checks every value
and name before any job runs."""
