# The programs of the apps suite, as Debian ships them (scripts/bench.sh
# --suite apps, scripts/test-apps.sh, and scripts/test.sh before `cargo test`,
# whose apps case runs them when gst-launch-1.0 and the rest are installed:
# GStreamer without its base/good plugins would fail the RTP cases).
# Source it, then: scripts/ensure-pkgs.sh "${APPS_PKGS[@]}"
APPS_PKGS=(nginx-light wrk redis-server redis-tools memcached aria2 iperf3
    gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
    fonts-dejavu-core iproute2 nftables)
