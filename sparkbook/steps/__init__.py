"""One module per notebook, each with the face of :mod:`sparkbook.book.step`."""
