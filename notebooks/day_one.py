# %% [markdown]
# # Day one · from "cabled, SSH works" to a parameters file and a configured fabric
#
# Before [00_inventory.ipynb](00_inventory.ipynb). Given only the nodes' SSH names, this notebook
# asks every node what it is (OS, kernel, GPU, memory, the management interface, every CX-7 port:
# cabled or not, speed, MTU, PCIe function, addresses and what persists them), writes the parameters
# file the runbook reads, then plans the fabric: sparkbook's netplan file on every node (both twins,
# one subnet per rail, MTU 9000), the diff against what the node has, netplan's own parser run on
# the node, and SSH between the nodes over the rails. With `apply = True` it applies the plan: every
# file it replaces is backed up first, and a guard **on each node** restores the backup by itself
# unless sparkbook confirms over a fresh SSH connection, with the rails as planned, within
# `deadline` seconds. `sparkbook fabric restore -p FILE` undoes it: the files byte for byte, the
# addresses as before.
#
# The same as `sparkbook discover HOST... -o FILE`, then `sparkbook fabric plan|apply -p FILE`.

# %% tags=["parameters"]
# Parameters. hosts: the nodes' SSH names (addresses, or aliases from ~/.ssh/config), the head first.
hosts = []
output = "parameters/discovered.yaml"  # the parameters file to write
force = False  # replace `output` if it exists
template = None  # the file the other sections come from (default: dgx-spark-pair.yaml, quad for more nodes)
name = "discovered"  # the deployment's name
user = None  # SSH user on every node (default: ~/.ssh/config's, or yours)
key = None  # private key file on this machine
known_hosts = []  # known_hosts files read besides ~/.ssh/known_hosts
apply = False  # True: apply the fabric plan (backed up, each node under its own guard)
deadline = 90  # seconds each node's guard waits for sparkbook's confirmation

# %% tags=["hide-input"]
from sparkbook.steps import day_one as step

# %% [markdown]
# ## The nodes, and the parameters file
#
# One SSH round trip per node, all at once, changing nothing. Nothing is written unless every node
# answers; what could not be decided is a comment in the file and a NOTE below, never a guess. On
# nodes fresh from the box the rails get addresses by the stated scheme (rail N on the N-th free
# /24 from 192.168.100.0/24, the host number from the management address).

# %%
params_file = step.discover(hosts, output, template=template, name=name, user=user, key=key,
                            known_hosts=known_hosts, force=force)

# %% [markdown]
# ## The fabric: the plan, and with `apply = True` the change
#
# Per node: the diff of `/etc/netplan/40-sparkbook-fabric.yaml`, each address and MTU that changes,
# what else lets go (NetworkManager's profile), netplan's parser on the node's files with the new
# one, then the lines SSH between the nodes needs. Applied, each node's change is confirmed only
# when every node's is applied as planned; otherwise every node is rolled back.

# %%
verdict = step.fabric_step(params_file, "apply" if apply else "plan", deadline)

# %% [markdown]
# ## Verdict

# %% tags=["hide-input"]
step.conclude(verdict)

# %% [markdown]
# ## Next
#
# [00_inventory.ipynb](00_inventory.ipynb) with the file written above (`sparkbook run -p FILE`
# runs the whole runbook). Read the file first: the model, the image and the serving choices come
# from the template and are still yours.
#
# ## When it failed
#
# - **A node did not answer**: its SSH error and the remedy are printed above; nothing was written.
# - **The plan cannot be applied**: each problem is named per node (another netplan file that
#   configures a rail, a file root's alone that `sudo -n` may not read, no netplan, no root).
# - **Apply rolled back**: the reason is in the verdict, and on the node in
#   `/var/lib/sparkbook/fabric/CHANGE/guard.log`; a node whose management address the change cut
#   came back by itself at the deadline.
