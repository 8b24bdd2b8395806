"""One module per command; each defines `command` (a click.Command)."""
