"""The `feather` command.

Each command reads its options into a spec (the library's own frozen dataclass), runs it,
then reports: a table on the console and, for benchmarks, a JSON record
(`bench.machine.write_record`). Bad input found after option parsing exits with status 2 and
a message on stderr, as the option parser's own errors do.

One module per command (`records`, `bench`, `sglang_bench`, `calibrate`, `index_bench`,
`train`, `trace`, `replay`, `vllm_bench`, `model`, `results`) over `common` (the app, its
consoles, the failure rule, parsing helpers) and `options` (every option, declared once);
importing this package registers them all, in the order `feather --help` lists them.
"""

# The registration order is the order `feather --help` lists the commands in.
# isort: off
from feather_lab.cli import records  # noqa: F401
from feather_lab.cli import bench  # noqa: F401
from feather_lab.cli import sglang_bench  # noqa: F401
from feather_lab.cli import calibrate  # noqa: F401
from feather_lab.cli import index_bench  # noqa: F401
from feather_lab.cli import train  # noqa: F401
from feather_lab.cli import trace  # noqa: F401
from feather_lab.cli import replay  # noqa: F401
from feather_lab.cli import vllm_bench  # noqa: F401
from feather_lab.cli import model  # noqa: F401
from feather_lab.cli import results  # noqa: F401

# isort: on
from feather_lab.cli.common import app

__all__ = ["app"]
