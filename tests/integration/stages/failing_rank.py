"""A worker module for test_fork_agent: rank 1 raises, rank 0 waits to be stopped."""
import os
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError(f"rank 1 fails on purpose (argv {sys.argv[1:]})")
    time.sleep(600)  # past the test's timeout: only the agent's SIGTERM ends it in time


if __name__ == "__main__":
    main()
