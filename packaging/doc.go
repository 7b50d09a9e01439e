// Package packaging holds what installs Berth on a server, and the tests
// that check it:
//
//   - berthd.service, the systemd unit;
//   - scripts/, the .deb's maintainer scripts (service user, restart on
//     upgrade);
//   - mkdeb/, a module of its own that builds the .deb with nfpm
//     (`make deb`);
//   - grafana-dashboard.json, a dashboard over the metrics in
//     docs/METRICS.md.
//
// The package has no code: its tests build a .deb the way `make deb` does
// and read it back (an ar archive of debian-binary, control.tar.gz and
// data.tar.gz) with the standard library.
package packaging
