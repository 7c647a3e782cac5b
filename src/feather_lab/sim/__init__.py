"""The simulator: an iteration-level engine in the shape of vLLM V1, driving the same
admission dialogue as the engines."""
