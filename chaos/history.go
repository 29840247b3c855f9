package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// OpKind names a request the traffic makes.
type OpKind string

// The requests of the traffic, all on ConfigMaps of the traffic's namespace.
const (
	OpCreate OpKind = "create" // POST of a new object
	OpUpdate OpKind = "update" // PUT with metadata.resourceVersion as the precondition
	OpDelete OpKind = "delete" // DELETE with preconditions.resourceVersion
	OpGet    OpKind = "get"    // GET with resourceVersion "" (a linearizable read)
	OpList   OpKind = "list"   // LIST with resourceVersion "" (a linearizable read)
)

// Outcome is what the client learnt of a request.
type Outcome string

const (
	// OutcomeOK: the server answered with success.
	OutcomeOK Outcome = "ok"
	// OutcomeFailed: the server answered with a definite failure (a 4xx other than 408: 404, 409, 422...);
	// the request had no effect, and the failure itself says something of the state (404: absent; 409 on a
	// create: present; 409 on an update or delete: another version).
	OutcomeFailed Outcome = "failed"
	// OutcomeUnknown: no definite answer (a timeout, a connection error, a 5xx such as 503 or a 504
	// "outcome unknown"): a write may or may not have taken effect, at any time after its call.
	OutcomeUnknown Outcome = "unknown"
)

// Op is one request of the history. Times are offsets from the history's start on one monotonic clock.
type Op struct {
	Worker int    // the worker that made it; a worker makes one request at a time
	Server string // the kubeconfig context (server) it was sent to

	Kind  OpKind
	Key   string // the ConfigMap's name; "" for a list
	Value string // create and update: the value written, unique in the history
	// PreconditionRV is the resourceVersion an update or delete required the object to have.
	PreconditionRV int64
	// Stale marks an update sent on purpose with a resourceVersion older than one the worker had just read:
	// it must fail with 409.
	Stale bool

	Call, Return time.Duration

	Outcome Outcome
	Code    int    // the HTTP status of an error the server answered (a definite failure, or a 5xx); else 0
	Reason  string // the Status reason of that error (AlreadyExists, Conflict, NotFound, Timeout...)
	Err     string // the error, for the report

	// RV is the resourceVersion in the answer: a written object's (create, update), the object read (get),
	// or the list's (list).
	RV int64
	// Found is whether a successful get returned an object (a get that found none has OutcomeFailed, 404).
	Found bool
	// ReadValue is the value a successful get returned.
	ReadValue string
	// Items is the objects a successful list returned, ordered by key.
	Items []Item
}

// Item is one object of a list.
type Item struct {
	Key   string
	Value string
	RV    int64
}

// FinalObject is one object of the final state (Traffic.ReadFinal), keyed by name.
type FinalObject struct {
	Value string
	RV    int64
}

// History is what a traffic run recorded, ordered by call time.
type History struct {
	Namespace string
	Servers   []string      // the kubeconfig contexts used
	Start     time.Time     // the wall-clock time of offset 0
	Duration  time.Duration // from the start to the last return
	Ops       []Op
	// Final is the state read once the faults healed and writes went through again (ReadFinal), when it
	// could be read: the linearizability check uses it to settle unknown writes (see linPartitions).
	Final map[string]FinalObject `json:",omitempty"`
	// Err is set when the run could not start (the namespace could not be prepared); Ops is then empty.
	Err error `json:"-"`
}

// Counts counts the operations by kind and outcome, for the report: "get/ok", "update/unknown", and for
// definite failures the status code, as in "update/409" or "get/404".
func (h *History) Counts() map[string]int {
	out := map[string]int{}
	for i := range h.Ops {
		out[h.Ops[i].countKey()]++
	}
	return out
}

func (o *Op) countKey() string {
	switch o.Outcome {
	case OutcomeFailed:
		return fmt.Sprintf("%s/%d", o.Kind, o.Code)
	default:
		return fmt.Sprintf("%s/%s", o.Kind, o.Outcome)
	}
}

// isWrite is true for creates, updates and deletes.
func (o *Op) isWrite() bool { return o.Kind == OpCreate || o.Kind == OpUpdate || o.Kind == OpDelete }

// acked is true for a create or update the server acknowledged: its value is a version of the key, at RV.
func (o *Op) acked() bool {
	return (o.Kind == OpCreate || o.Kind == OpUpdate) && o.Outcome == OutcomeOK
}

// notFound is a definite failure with 404: the object did not exist.
func (o *Op) notFound() bool { return o.Outcome == OutcomeFailed && o.Code == 404 }

// String describes the op for error messages.
func (o *Op) String() string {
	s := string(o.Kind)
	if o.Key != "" {
		s += " " + o.Key
	}
	if o.Value != "" {
		s += "=" + o.Value
	}
	if o.PreconditionRV != 0 {
		s += fmt.Sprintf(" if rv=%d", o.PreconditionRV)
	}
	if o.Stale {
		s += " (stale)"
	}
	s += fmt.Sprintf(" by w%d", o.Worker)
	if o.Server != "" {
		s += " via " + o.Server
	}
	s += fmt.Sprintf(" [%v, %v] -> %s", o.Call, o.Return, o.Outcome)
	switch {
	case o.Outcome == OutcomeFailed:
		s += fmt.Sprintf(" %d %s", o.Code, o.Reason)
	case o.Outcome == OutcomeUnknown:
		s += " (" + o.Err + ")"
	case o.Kind == OpGet:
		s += fmt.Sprintf(" %s rv=%d", o.ReadValue, o.RV)
	case o.Kind == OpList:
		s += fmt.Sprintf(" rv=%d %d items", o.RV, len(o.Items))
	default:
		s += fmt.Sprintf(" rv=%d", o.RV)
	}
	return s
}

// SaveHistory writes a history as JSON, for CheckLinearizable to run on again (LoadHistory).
func SaveHistory(h *History, path string) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// LoadHistory reads a history SaveHistory wrote.
func LoadHistory(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	h := &History{}
	return h, json.Unmarshal(b, h)
}
