"""`python -m audit.verify_bundle FILE --public-key KEY`: the offline verifier's published command, kept
at this name for everyone who holds a bundle (third parties, scripts, the bundle's own instructions).
The verifier is `audit.verify.offline`; like it, this module imports no Django."""

import sys

from audit.verify.offline import main

if __name__ == "__main__":
    sys.exit(main())
