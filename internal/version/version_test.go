package version

import (
	"strings"
	"testing"
)

func TestSkewPolicy(t *testing.T) {
	for _, tt := range []struct {
		agent, server string
		want          string // a piece of the error, or "" for allowed
	}{
		{"v1.4.0", "v1.4.2", ""},
		{"v1.2.9", "v1.4.0", ""},
		{"1.3.0", "v1.4.0-rc.1", ""},
		{"dev", "v1.4.0", ""},
		{"v1.4.0", "3f2a9c1", ""},
		{"v1.5.0", "v1.4.0", "newer than the servers"},
		{"v1.1.0", "v1.4.0", "more than 2 minor versions older"},
		{"v2.0.0", "v1.9.0", "different major versions"},
	} {
		err := CheckAgent(tt.agent, tt.server)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckAgent(%s, %s) = %v, want %q", tt.agent, tt.server, err, tt.want)
		}
	}
	if err := CheckServers("v1.4.0", "v1.5.1"); err != nil {
		t.Errorf("one minor apart: %v", err)
	}
	if err := CheckServers("v1.3.0", "v1.5.0"); err == nil || !strings.Contains(err.Error(), "one minor version at a time") {
		t.Errorf("two minor apart: %v", err)
	}
}
