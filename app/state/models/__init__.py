"""What the app keeps about models: the Library's rows (model_library.py), each model's own defaults
(model_defaults.py) and runtime choices (runtime_choices.py), which model made an answer
(model_record.py, model_match.py), the servers the user connects to (servers.py). Qt-free."""
