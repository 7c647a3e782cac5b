"""Every admission policy behind one interface (`base.Policy`), by name in `registry`."""
