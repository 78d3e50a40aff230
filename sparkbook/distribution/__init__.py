"""The same image and the same model on every node, sending only what is missing (03, and 02
before its sweep).

- :mod:`.image`: what every node's Docker holds (the survey), and the head's image streamed into
  the workers' ``docker load`` without the layers they hold (or ``docker pull`` everywhere).
- :mod:`.model`: the model manifest compared with the head's, and rsync of the differing files.
"""
