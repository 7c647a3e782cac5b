"""bench: `feather bench` on the simulator, and every bench's rows, columns and rendering.

One spec (`suite.BenchSpec`), the simulator runs (`runner`, `suite`, `cluster`, `oracle`),
typed rows with their columns declared once (`rows`, `columns`) and how they are printed,
plotted and compared (`output`, `report`, `results`); the records' machine stamp
(`machine`). The real-engine runs live in `harness/`, which renders through this package.
"""
