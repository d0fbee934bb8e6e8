"""Qt-free owners of the window's runs (chat, experiments, loom, serving, model comparison); views subscribe."""
