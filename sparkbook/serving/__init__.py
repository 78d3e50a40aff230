"""The serving containers shared by 04 (Ray cluster), 05 (serve) and 08 (teardown).

- :mod:`.containers`: what every sparkbook container gets (host network, GPUs, RDMA, the fabric);
- :mod:`.plan`: the serving plan, computed once: every container's name, command, environment,
  secrets and fingerprint (built by :mod:`.commands`: ``ray start``, ``vllm serve``, ``docker run``);
- :mod:`.inspection`: what the serving image can do, and the checks that it can do what is asked;
- :mod:`.state`: the containers on the nodes, starting them, what must hold before;
- :mod:`.ray`: the Ray cluster (04); :mod:`.deploy`: vLLM up and ready (05);
  :mod:`.teardown`: everything off (08);
- :mod:`.logs`: the nodes' logs into the run folder, and the known failure signatures in them;
- :mod:`.listeners`: every address the containers listen on, and whether it is where it should be.

The notebooks' own calls are here: the image (04, 05) and the commands to rerun by hand.
"""

from .plan import commands_table
from .inspection import image_checks, image_table, inspect_image

__all__ = ["commands_table", "image_checks", "image_table", "inspect_image"]
