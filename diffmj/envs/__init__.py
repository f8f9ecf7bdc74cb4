"""Environment interfaces over diffmj: ``diffmj.envs.torchrl`` (needs torchrl) and ``diffmj.envs.gymnasium``
(needs gymnasium), installed by the ``envs`` extra (``pip install -e ".[envs]"``). The core package never
imports this one; import the submodule you use."""
