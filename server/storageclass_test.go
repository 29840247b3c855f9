package server

import (
	"testing"

	"github.com/skiff-dev/skiff/nodeagent"
)

// The class the servers create names the provisioner the agents run.
func TestLocalPathProvisionerName(t *testing.T) {
	if localPathProvisioner != nodeagent.LocalPathProvisioner {
		t.Fatalf("the local-path class names %q, the agents provision %q", localPathProvisioner, nodeagent.LocalPathProvisioner)
	}
}
