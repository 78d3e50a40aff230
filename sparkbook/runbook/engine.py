"""How ``sparkbook run`` executes one notebook: papermill's nbclient engine, with a calm terminal.

papermill with ``log_output`` logs a line as each cell starts and ends and every output, and the
kernel process writes its own warnings (tornado, zmq, ipykernel) to the stderr it inherited. By
default ``sparkbook run`` shows what the cells show and no more: their streams and the plain text
of what they display, with the kernel process's stdout and stderr in a log file of the run folder;
``verbose`` (``sparkbook run -v``) is papermill's logging as it is, and the kernel process's
output on the terminal (the runner relays it, masked). In both, a display updated in place (:class:`sparkbook.book.progress.Progress`) reaches
the terminal while its cell runs: nbclient applies ``update_display_data`` to the saved notebook
but returns no output for it, so papermill never logs it and a terminal would see only its first
state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from nbformat import NotebookNode
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.log import logger as papermill_log
from traitlets import Any as AnyTrait, Bool

NAME = "sparkbook"
# a display updated in place reaches the terminal at most this often (each display on its own),
# and with its last state when its cell ends
UPDATE_EVERY_S = 10.0
log = logging.getLogger("sparkbook.run")  # the cells' outputs and display updates on the terminal


def plain(data: dict) -> str:
    """The text/plain of a display's bundle, without its trailing newlines ('' when none)."""
    text = data.get("text/plain", "")
    return ("".join(text) if isinstance(text, list) else text).rstrip("\n")


class Client(PapermillNotebookClient):
    """papermill's client that says what the cells show (see the module) and sends the kernel
    process's stdout and stderr to ``kernel_log`` where one is given."""

    kernel_log = AnyTrait(None, allow_none=True,
                          help="open file for the kernel process's stdout and stderr (None: this process's)")
    # no widget state in the executed notebooks: without it nbconvert renders a widget's output by
    # its next format (the text/html snapshot) and the offline report loads no widget JavaScript
    # source: https://github.com/jupyter/nbconvert/blob/main/nbconvert/filters/widgetsdatatypefilter.py
    store_widget_state = Bool(False)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._shown: dict[str, tuple[float, str]] = {}  # display id: when and what was logged
        self._pending: dict[str, str] = {}  # display id: a later state not logged yet
        self._due: dict[str, asyncio.TimerHandle] = {}  # display id: when its later state is logged

    def execute(self, **kwargs: Any) -> NotebookNode:
        if self.kernel_log is not None:  # reaches AsyncKernelManager.start_kernel, then Popen
            kwargs.update(stdout=self.kernel_log, stderr=self.kernel_log)
        # no browser watches these kernels, even when a Jupyter server's kernel (the front page)
        # started this run: without its session name, Progress shows text, not widgets
        kwargs["env"] = {k: v for k, v in os.environ.items() if k != "JPY_SESSION_NAME"}
        return super().execute(**kwargs)

    def execute_cell(self, cell: NotebookNode, cell_index: int, *args: Any, **kw: Any) -> NotebookNode:
        try:
            return super().execute_cell(cell, cell_index, *args, **kw)
        finally:
            for handle in self._due.values():
                handle.cancel()
            self._due.clear()
            for display_id, text in list(self._pending.items()):  # each display's last state
                self._show(display_id, text)
            self._pending.clear()

    def process_message(self, msg: dict, cell: NotebookNode, cell_index: int) -> NotebookNode | None:
        content = msg["content"]
        display_id = (content.get("transient") or {}).get("display_id")
        if msg["msg_type"] == "update_display_data" and display_id:
            self._update(display_id, plain(content.get("data") or {}))
        output = super().process_message(msg, cell, cell_index)  # papermill logs it with -v
        if output is not None:
            text = output.get("text", "") if output.output_type == "stream" else plain(output.get("data") or {})
            if display_id:
                self._shown[display_id] = (time.monotonic(), text)
            if not self.log_output and text.strip():
                log.info(text.rstrip("\n"))
        return output

    def _update(self, display_id: str, text: str) -> None:
        at, last = self._shown.get(display_id, (0.0, ""))
        if text == last or not text:
            self._pending.pop(display_id, None)
        elif time.monotonic() - at >= UPDATE_EVERY_S:
            self._show(display_id, text)
        else:  # logged when its time comes, also when no later update comes (a hang)
            self._pending[display_id] = text
            if display_id not in self._due:
                delay = UPDATE_EVERY_S - (time.monotonic() - at)
                self._due[display_id] = asyncio.get_running_loop().call_later(delay, self._when_due, display_id)

    def _when_due(self, display_id: str) -> None:
        self._due.pop(display_id, None)
        if display_id in self._pending:
            self._show(display_id, self._pending[display_id])

    def _show(self, display_id: str, text: str) -> None:
        self._pending.pop(display_id, None)
        self._shown[display_id] = (time.monotonic(), text)
        log.info(text)


class Engine(NBClientEngine):
    """papermill's nbclient engine with :class:`Client` (papermill_engines.register's way)."""

    @classmethod
    def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, log_output: bool = False,
                                 start_timeout: float = 60, execution_timeout: float | None = None,
                                 **kwargs: Any) -> NotebookNode:
        kwargs.pop("input_path", None)
        return Client(nb_man, kernel_name=kernel_name, log=papermill_log, log_output=log_output,
                      timeout=execution_timeout, startup_timeout=start_timeout, **kwargs).execute()


papermill_engines.register(NAME, Engine)
