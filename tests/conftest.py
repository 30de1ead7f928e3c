import sys
from pathlib import Path

# Let tests import their small shared module (notebook_tools) by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))
