"""Run folders read as received from elsewhere: the shape of every file in one (``shapes``) and
readers and a page writer that trust nothing in it (``folder``)."""
