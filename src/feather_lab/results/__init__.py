"""`feather results`: every published figure traced to its record, and records kept honest.

`figures` checks each figure a doc quotes against the record it names; `provenance` reads what
a record says about how it was made; `staleness` compares a record's age with the code it
measures; `quick` re-makes the simulated records from today's code.
"""
