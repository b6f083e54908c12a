import logging
import sys

from experiments.corpus import main

logging.basicConfig(level=logging.WARNING)
sys.exit(main())
