#!/usr/bin/env bash
# Sign LogitLab.app with a Developer ID certificate, notarize it with Apple, staple the ticket,
# and wrap it in a signed, notarized .dmg. For someone with an Apple Developer account.
#
#     python packaging/build.py                       # on an Apple Silicon Mac: dist/LogitLab.app
#     packaging/macos/sign_and_notarize.sh [dist/LogitLab.app]
#
# Settings (environment variables; the defaults are placeholders that will not work):
#   SIGN_IDENTITY     the certificate's name as `security find-identity -v -p codesigning` shows it,
#                     e.g. "Developer ID Application: Jane Doe (ABCDE12345)"
#   NOTARY_PROFILE    a notarytool keychain profile made once with
#                     `xcrun notarytool store-credentials logitlab-notary --apple-id … --team-id … --password <app-specific password>`
#   ENTITLEMENTS      hardened-runtime entitlements (default: packaging/macos/entitlements.plist)
#   DMG               where to write the disk image (default: dist/LogitLab-<version>-arm64.dmg)
#   SKIP_NOTARIZE=1   sign only (for a local test of the signature)
set -euo pipefail

SIGN_IDENTITY="${SIGN_IDENTITY:-Developer ID Application: CHANGE ME (TEAMID)}"
NOTARY_PROFILE="${NOTARY_PROFILE:-logitlab-notary}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
ENTITLEMENTS="${ENTITLEMENTS:-$HERE/entitlements.plist}"
APP="${1:-$ROOT/dist/LogitLab.app}"

[[ "$(uname)" == Darwin ]] || { echo "run this on macOS (codesign, notarytool and hdiutil are Apple tools)" >&2; exit 2; }
[[ -d "$APP" ]] || { echo "no app at $APP: build it first with python packaging/build.py" >&2; exit 2; }
if [[ "$SIGN_IDENTITY" == *"CHANGE ME"* ]]; then
    echo "set SIGN_IDENTITY to your Developer ID Application certificate (see the top of $0)" >&2
    exit 2
fi
VERSION="$(/usr/libexec/PlistBuddy -c 'Print :CFBundleShortVersionString' "$APP/Contents/Info.plist")"
DMG="${DMG:-$ROOT/dist/LogitLab-$VERSION-arm64.dmg}"

sign() {  # hardened runtime and a secure timestamp are what notarization requires
    codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$SIGN_IDENTITY" "$@"
}

echo "== signing every library and executable inside $APP, then the frameworks, then the app"
# codesign --deep is deprecated for signing. A Mach-O file's signature covers that file only, so the
# files go in any order; a bundle's covers what is inside it, so frameworks come after their files.
find "$APP/Contents" -type f -print0 | while IFS= read -r -d '' file; do
    if file -b "$file" | grep -q 'Mach-O'; then sign "$file"; fi
done
find "$APP/Contents" -type d -name '*.framework' -print0 | while IFS= read -r -d '' fw; do sign "$fw"; done
sign "$APP"
codesign --verify --strict --deep --verbose=2 "$APP"

if [[ "${SKIP_NOTARIZE:-0}" == 1 ]]; then
    echo "signed (not notarized): $APP"
    exit 0
fi

echo "== notarizing the app"
ZIP="$(mktemp -d)/LogitLab.zip"
ditto -c -k --keepParent "$APP" "$ZIP"
xcrun notarytool submit "$ZIP" --keychain-profile "$NOTARY_PROFILE" --wait
xcrun stapler staple "$APP"
spctl --assess --type execute --verbose=2 "$APP"

echo "== making, signing and notarizing $DMG"
rm -f "$DMG"
STAGE="$(mktemp -d)"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname "Logit Lab $VERSION" -srcfolder "$STAGE" -ov -format UDZO "$DMG"
codesign --force --timestamp --sign "$SIGN_IDENTITY" "$DMG"
xcrun notarytool submit "$DMG" --keychain-profile "$NOTARY_PROFILE" --wait
xcrun stapler staple "$DMG"
echo "done: $DMG"
