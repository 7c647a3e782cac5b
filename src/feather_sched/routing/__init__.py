"""Cluster routing: which replica serves a request (`rules`), shared by the simulator's
multi-replica mode and the Ray Serve router."""
