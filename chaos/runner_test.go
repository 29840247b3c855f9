package chaos

import (
	"slices"
	"testing"
)

// A plan's faults are all used, in rounds of up to n, and one that must run alone never shares its round.
func TestTakeFaults(t *testing.T) {
	plan := []string{"kill-leader", "full-crash", "pause-leader", "netem", "disk-full", "kill-agent", "partition-leader"}
	counts := map[string]int{}
	next := 0
	for range 20 {
		var faults []string
		faults, plan = takeFaults(plan, next, 2)
		next += len(faults)
		if len(faults) == 0 || len(faults) > 2 {
			t.Fatalf("a round of %v", faults)
		}
		for _, f := range faults {
			counts[f]++
			if ff, _ := FaultByName(f); ff.Alone && len(faults) > 1 {
				t.Fatalf("%s shares a round: %v", f, faults)
			}
		}
	}
	for _, f := range []string{"kill-leader", "full-crash", "pause-leader", "netem", "disk-full", "kill-agent", "partition-leader"} {
		if counts[f] == 0 {
			t.Errorf("%s never ran: %v", f, counts)
		}
	}
	if !slices.Contains(plan, "full-crash") || len(plan) != 7 {
		t.Errorf("the plan lost faults: %v", plan)
	}
}
