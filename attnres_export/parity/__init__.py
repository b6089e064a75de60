"""Backends behind one runner interface, error metrics, pass bars and the parity report."""
