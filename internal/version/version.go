// Package version is Skiff's release version and its version skew policy: which agent versions may join
// servers of a version, and which server versions may run together during a rolling upgrade.
package version

import (
	"fmt"
	"regexp"
	"strconv"
)

// Version is set by the build (-ldflags "-X github.com/skiff-dev/skiff/internal/version.Version=v1.2.3").
// A build from a source tree without a release tag is "dev" or a commit name, which the policy does not
// check.
var Version = "dev"

// Path is where a server says its version, unauthenticated, as /version says kube's.
const Path = "/v1/version"

// Info is the answer at Path.
type Info struct {
	Version string `json:"version"`
}

// The policy, as Kubernetes has it for kubelets: an agent may be up to MaxAgentLag minor versions older than
// the servers, never newer (upgrade the servers first); servers may be one minor version apart, while a
// rolling upgrade runs. The major version must match.
const (
	MaxAgentLag  = 2
	MaxServerLag = 1
)

var release = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$`)

// parse reads a release version's major and minor numbers; ok is false for dev and commit builds.
func parse(v string) (major, minor int, ok bool) {
	m := release.FindStringSubmatch(v)
	if m == nil {
		return 0, 0, false
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, true
}

// CheckAgent says whether an agent of version agent may join servers of version server, with the reason
// and the remedy when it may not. Either side being a dev build passes.
func CheckAgent(agent, server string) error {
	am, an, ok1 := parse(agent)
	sm, sn, ok2 := parse(server)
	switch {
	case !ok1 || !ok2:
		return nil
	case am != sm:
		return fmt.Errorf("agent %s and servers %s are of different major versions: upgrade the servers, then the agents, one minor version at a time", agent, server)
	case an > sn:
		return fmt.Errorf("agent %s is newer than the servers (%s): upgrade the servers first, then the agents", agent, server)
	case sn-an > MaxAgentLag:
		return fmt.Errorf("agent %s is more than %d minor versions older than the servers (%s): upgrade the agent", agent, MaxAgentLag, server)
	}
	return nil
}

// CheckServers says whether servers of versions a and b may run in one cluster.
func CheckServers(a, b string) error {
	am, an, ok1 := parse(a)
	bm, bn, ok2 := parse(b)
	switch {
	case !ok1 || !ok2:
		return nil
	case am != bm || an-bn > MaxServerLag || bn-an > MaxServerLag:
		return fmt.Errorf("servers %s and %s are more than %d minor version apart: upgrade one minor version at a time", a, b, MaxServerLag)
	}
	return nil
}
