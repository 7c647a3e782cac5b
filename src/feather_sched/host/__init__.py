"""The host core every engine adapter shares: the admission dialogue with a policy, its
counters and failure rule (admission.py)."""
