"""OnePlus: CLI, client and the embedded dev stack."""
