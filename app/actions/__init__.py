"""What the menus do, on a typed ActionContext (app/actions/context.py) instead of the window."""
