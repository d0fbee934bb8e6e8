#!/bin/sh
# Add Logit Lab to the desktop's application menu for the current user (no root needed).
#
# Run it from the unpacked LogitLab folder, wherever you keep it:
#     ./install-desktop-entry.sh            # install or update the menu entry
#     ./install-desktop-entry.sh --remove   # remove it again
# It writes ~/.local/share/applications/logitlab.desktop (pointing at this
# folder's LogitLab) and the icon into ~/.local/share/icons/hicolor. Run it
# again after moving the folder.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
apps="$data/applications"
icons="$data/icons/hicolor"

if [ "${1:-}" = "--remove" ]; then
    rm -f "$apps/logitlab.desktop"
    for png in "$here"/icons/logitlab-*.png; do
        size=$(basename "$png" .png | sed 's/logitlab-//')
        rm -f "$icons/${size}x${size}/apps/logitlab.png"
    done
    echo "removed the Logit Lab menu entry"
else
    mkdir -p "$apps"
    for png in "$here"/icons/logitlab-*.png; do
        size=$(basename "$png" .png | sed 's/logitlab-//')
        mkdir -p "$icons/${size}x${size}/apps"
        cp "$png" "$icons/${size}x${size}/apps/logitlab.png"
    done
    # Exec needs an absolute path; quote it in case the folder's path has spaces.
    sed "s|^Exec=.*|Exec=\"$here/LogitLab\"|" "$here/logitlab.desktop" > "$apps/logitlab.desktop"
    chmod 644 "$apps/logitlab.desktop"
    echo "installed $apps/logitlab.desktop -> $here/LogitLab"
fi
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$apps" || true
command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "$icons" || true
