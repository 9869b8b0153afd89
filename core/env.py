"""The one place the process environment is read.

Every setting that may differ between machines comes from the environment (or a `.env` file at the
project root, which `read_env` loads without overriding variables that are already set). Import `env`
and `BASE_DIR` from here; never call `os.environ` elsewhere.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

_dotenv = BASE_DIR / ".env"
if _dotenv.is_file():
    environ.Env.read_env(str(_dotenv), overwrite=False)
