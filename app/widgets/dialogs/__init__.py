"""The library, Connect, the llama.cpp and runtime settings, chat templates, Serve, file dialogs, the model picker."""
