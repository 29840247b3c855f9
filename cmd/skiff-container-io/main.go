// Command skiff-container-io is a container's stdio process on a node (package nodeagent/containerio): the
// agent starts one per container, and it writes the container's output to its CRI log file and holds its
// stdin. It is a binary of its own, apart from skiff, so that each of these long-lived processes carries a
// small program rather than the whole agent (docs/BENCHMARKS.md measures the difference).
package main

import (
	"fmt"
	"os"

	"github.com/skiff-dev/skiff/nodeagent/containerio"
)

func main() {
	containerio.RunChildIfAsked()
	fmt.Fprintln(os.Stderr, "skiff-container-io is started by `skiff agent`, one for each container; it is not run by hand")
	os.Exit(2)
}
