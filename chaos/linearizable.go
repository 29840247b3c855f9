package chaos

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checks of a traffic history. Skiff's resourceVersion is the Raft index of the write that made the
// version (apiserver/raftstore), so resourceVersions order every version of every object in one sequence:
//
//   - CheckLinearizable: every key's operations are linearizable (porcupine, with the model below), and
//     resourceVersions are unique and monotonic (CheckRevisions).
//   - CheckListFreshness: every consistent list is a snapshot of the store at its resourceVersion, and that
//     resourceVersion is not older than anything acknowledged before the list was sent.
//   - CheckNoLostWrites: every acknowledged version is in the final state or was replaced.
//
// An operation with an unknown outcome (Outcome unknown) may have taken effect at any time after its call,
// or never. For porcupine it returns at the end of time, with no output: the model applies it when its
// precondition holds, which covers "it happened there", and porcupine may place it after everything else,
// which covers "it never happened". Reads without an answer say nothing and are left out.

// maxViolations bounds how many violations of one check an error lists.
const maxViolations = 20

// violations collects what a check found.
type violations struct {
	n    int
	msgs []string
}

func (v *violations) addf(format string, args ...any) {
	v.n++
	if len(v.msgs) < maxViolations {
		v.msgs = append(v.msgs, fmt.Sprintf(format, args...))
	}
}

func (v *violations) err(what string) error {
	if v.n == 0 {
		return nil
	}
	more := ""
	if v.n > len(v.msgs) {
		more = fmt.Sprintf("; and %d more", v.n-len(v.msgs))
	}
	return fmt.Errorf("%d %s: %s%s", v.n, what, strings.Join(v.msgs, "; "), more)
}

// --- The porcupine model: one ConfigMap ---

// linInput is a request on one key. A list is a read of every key (Kind OpList).
type linInput struct {
	Op    int // the index in History.Ops
	Kind  OpKind
	Key   string
	Value string // create, update
	Pre   int64  // update, delete: the resourceVersion precondition (0: none)
}

// linOutput is its answer.
type linOutput struct {
	Unknown bool // no answer: the write may or may not have happened
	OK      bool
	Code    int    // a definite failure's status code
	Reason  string // and its reason
	Found   bool   // a read found the object
	Value   string // the value read
	RV      int64  // the version written or read
}

// linState is one key. RV is 0 when the object was written by a request without an answer, so that its
// resourceVersion is not known yet; the next read of it tells. Floor is the greatest resourceVersion this
// key is known to have had, so that a new version must have a greater one.
type linState struct {
	Exists bool
	Value  string
	RV     int64
	Floor  int64
}

// canHaveRV is whether the object's resourceVersion may be rv.
func (s linState) canHaveRV(rv int64) bool {
	return s.RV == rv || (s.RV == 0 && rv > s.Floor)
}

// preconditionHolds is whether a write with precondition pre would be applied.
func (s linState) preconditionHolds(pre int64) bool {
	return s.Exists && (pre == 0 || s.canHaveRV(pre))
}

// replacedBy is the state after a successful update (rv 0 if unknown) or delete.
func (s linState) replacedBy(in linInput, rv int64) linState {
	floor := max(s.Floor, in.Pre, s.RV, rv)
	if in.Kind == OpDelete {
		return linState{Floor: floor}
	}
	return linState{Exists: true, Value: in.Value, RV: rv, Floor: floor}
}

// linStep is the sequential specification of a ConfigMap under Kubernetes' rules.
func linStep(s linState, in linInput, out linOutput) (bool, linState) {
	switch in.Kind {
	case OpGet, OpList:
		if !out.Found {
			return !s.Exists, s
		}
		if !s.Exists || s.Value != out.Value || !s.canHaveRV(out.RV) {
			return false, s
		}
		s.RV, s.Floor = out.RV, max(s.Floor, out.RV)
		return true, s
	case OpCreate:
		switch {
		case out.Unknown:
			if s.Exists {
				return true, s
			}
			return true, linState{Exists: true, Value: in.Value, Floor: s.Floor}
		case out.OK:
			if s.Exists || out.RV <= s.Floor {
				return false, s
			}
			return true, linState{Exists: true, Value: in.Value, RV: out.RV, Floor: out.RV}
		case out.Code == 409 && out.Reason == "AlreadyExists":
			return s.Exists, s
		default: // refused for another reason: no effect, no information
			return true, s
		}
	case OpUpdate, OpDelete:
		holds := s.preconditionHolds(in.Pre)
		switch {
		case out.Unknown:
			if !holds {
				return true, s
			}
			return true, s.replacedBy(in, 0)
		case out.OK:
			if !holds || (in.Kind == OpUpdate && out.RV <= max(s.Floor, in.Pre, s.RV)) {
				return false, s
			}
			return true, s.replacedBy(in, out.RV)
		case out.Code == 404:
			return !s.Exists, s
		case out.Code == 409:
			return s.Exists && in.Pre != 0 && s.RV != in.Pre, s
		default:
			return true, s
		}
	}
	return false, s
}

func linModel(parts [][]porcupine.Operation) porcupine.Model {
	return porcupine.Model{
		Partition: func([]porcupine.Operation) [][]porcupine.Operation { return parts },
		Init:      func() any { return linState{} },
		Step: func(state, input, output any) (bool, any) {
			return linStep(state.(linState), input.(linInput), output.(linOutput))
		},
		Hash: func(state any) uint64 {
			s := state.(linState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%t/%s/%d/%d", s.Exists, s.Value, s.RV, s.Floor)
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(linInput), output.(linOutput)
			var req string
			switch in.Kind {
			case OpCreate:
				req = fmt.Sprintf("create(%s)", in.Value)
			case OpUpdate:
				req = fmt.Sprintf("update(%s, rv=%d)", in.Value, in.Pre)
			case OpDelete:
				req = fmt.Sprintf("delete(rv=%d)", in.Pre)
			default:
				req = string(in.Kind) + "()"
			}
			switch {
			case out.Unknown:
				return req + " -> ?"
			case !out.OK:
				return fmt.Sprintf("%s -> %d %s", req, out.Code, out.Reason)
			case in.Kind == OpGet || in.Kind == OpList:
				if !out.Found {
					return req + " -> absent"
				}
				return fmt.Sprintf("%s -> %s@%d", req, out.Value, out.RV)
			case in.Kind == OpDelete:
				return req + " -> ok"
			default:
				return fmt.Sprintf("%s -> ok@%d", req, out.RV)
			}
		},
		DescribeState: func(state any) string {
			s := state.(linState)
			if !s.Exists {
				return fmt.Sprintf("absent (floor %d)", s.Floor)
			}
			rv := "?"
			if s.RV != 0 {
				rv = fmt.Sprint(s.RV)
			}
			return fmt.Sprintf("%s@%s", s.Value, rv)
		},
		DescribeOperationMetadata: func(info any) string { return fmt.Sprint(info) },
	}
}

// linPartitions turns the history into porcupine operations, one partition per key in key order. A
// worker's operations share a client lane until one has an unknown outcome, and the worker goes on in a new
// lane. Unknown writes are settled where the history allows, which keeps porcupine's search small after a
// full crash, when a hundred writes have no answer:
//   - one whose value a successful read returned took effect before that read returned, so it ends there
//     (values are unique);
//   - one that wrote a value no read returned and that is not its key's final value never took effect, and is
//     left out: had it taken effect, nothing could have replaced or deleted its version, since every update
//     and delete names the resourceVersion it replaces and no one saw that one, so it would be the final value;
//   - any other lasts to the end of time.
func linPartitions(h *History) ([]string, [][]porcupine.Operation) {
	seen := firstReads(h)
	keySet := map[string]bool{}
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Key != "" {
			keySet[op.Key] = true
		}
		for _, it := range op.Items {
			keySet[it.Key] = true
		}
	}
	keys := make([]string, 0, len(keySet))
	for k := range keySet {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	index := map[string]int{}
	for i, k := range keys {
		index[k] = i
	}
	parts := make([][]porcupine.Operation, len(keys))

	lanes, nextLane := map[int]int{}, 0
	lane := func(worker int) int {
		l, ok := lanes[worker]
		if !ok {
			l = nextLane
			nextLane++
			lanes[worker] = l
		}
		return l
	}
	for i := range h.Ops {
		op := &h.Ops[i]
		meta := fmt.Sprintf("op %d: %s", i, op)
		add := func(key string, in linInput, out linOutput) {
			ret := int64(op.Return)
			if out.Unknown {
				ret = math.MaxInt64
				if at, ok := seen[keyValue{key, in.Value}]; ok && in.Value != "" {
					ret = at
				}
			}
			in.Op, in.Key = i, key
			parts[index[key]] = append(parts[index[key]], porcupine.Operation{
				ClientId: lane(op.Worker), Input: in, Call: int64(op.Call), Output: out, Return: ret, Metadata: meta,
			})
		}
		switch op.Kind {
		case OpGet:
			switch {
			case op.Outcome == OutcomeOK:
				add(op.Key, linInput{Kind: OpGet}, linOutput{OK: true, Found: true, Value: op.ReadValue, RV: op.RV})
			case op.notFound():
				add(op.Key, linInput{Kind: OpGet}, linOutput{Code: 404, Reason: op.Reason})
			}
		case OpList:
			if op.Outcome != OutcomeOK {
				continue
			}
			items := map[string]Item{}
			for _, it := range op.Items {
				items[it.Key] = it
			}
			for _, k := range keys {
				it, found := items[k]
				add(k, linInput{Kind: OpList}, linOutput{OK: true, Found: found, Value: it.Value, RV: it.RV})
			}
		case OpCreate, OpUpdate, OpDelete:
			if op.Outcome == OutcomeUnknown && op.Kind != OpDelete && h.Final != nil && neverTookEffect(op, seen, h.Final) {
				continue
			}
			in := linInput{Kind: op.Kind, Value: op.Value, Pre: op.PreconditionRV}
			out := linOutput{Unknown: op.Outcome == OutcomeUnknown, OK: op.Outcome == OutcomeOK, Code: op.Code, Reason: op.Reason, RV: op.RV}
			if out.Unknown {
				out.Code, out.Reason = 0, ""
			}
			add(op.Key, in, out)
			if out.Unknown {
				delete(lanes, op.Worker)
			}
		}
	}
	return keys, parts
}

type keyValue struct{ key, value string }

// neverTookEffect says whether an unknown create or update can be left out (see linPartitions): no read
// returned its value and its key does not hold it in the final state.
func neverTookEffect(op *Op, seen map[keyValue]int64, final map[string]FinalObject) bool {
	if _, read := seen[keyValue{op.Key, op.Value}]; read {
		return false
	}
	f, ok := final[op.Key]
	return !ok || f.Value != op.Value
}

// firstReads is, for each value a successful get or list returned, when the first such read returned.
func firstReads(h *History) map[keyValue]int64 {
	out := map[keyValue]int64{}
	note := func(key, value string, ret int64) {
		kv := keyValue{key, value}
		if at, ok := out[kv]; !ok || ret < at {
			out[kv] = ret
		}
	}
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Outcome != OutcomeOK {
			continue
		}
		switch op.Kind {
		case OpGet:
			note(op.Key, op.ReadValue, int64(op.Return))
		case OpList:
			for _, it := range op.Items {
				note(it.Key, it.Value, int64(op.Return))
			}
		}
	}
	return out
}

// CheckLinearizable checks that the history is linearizable per key against the model of a ConfigMap
// (creates fail with AlreadyExists on an object that exists; updates and deletes apply only when the
// resourceVersion precondition matches and fail with 409 otherwise, 404 without an object; a new version
// has a resourceVersion greater than every earlier one of the key; reads and lists return the current
// version), giving porcupine at most timeout. It runs CheckRevisions as well. If porcupine finds no
// linearization, or runs out of time, and vizPath is not empty, it writes porcupine's visualization there.
func CheckLinearizable(h *History, timeout time.Duration, vizPath string) error {
	var errs []error
	if err := CheckRevisions(h); err != nil {
		errs = append(errs, err)
	}
	keys, parts := linPartitions(h)
	var all []porcupine.Operation
	for _, p := range parts {
		all = append(all, p...)
	}
	model := linModel(parts)
	res, info := porcupine.CheckOperationsVerbose(model, all, timeout)
	if res == porcupine.Ok {
		return errors.Join(errs...)
	}
	msg := ""
	if res == porcupine.Unknown {
		msg = fmt.Sprintf("the linearizability check ran out of its %v: result unknown", timeout)
	} else {
		msg = "not linearizable: " + describeNonLinearizable(keys, parts, info)
	}
	if vizPath != "" {
		if err := writeViz(model, info, vizPath); err != nil {
			msg += fmt.Sprintf(" (writing the visualization: %v)", err)
		} else {
			msg += " (visualization: " + vizPath + ")"
		}
	}
	return errors.Join(append(errs, errors.New(msg))...)
}

func writeViz(model porcupine.Model, info porcupine.LinearizationInfo, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return porcupine.VisualizePath(model, info, path)
}

// describeNonLinearizable names the keys porcupine could not linearize, each with the earliest operation
// left out of its longest linearizable prefix.
func describeNonLinearizable(keys []string, parts [][]porcupine.Operation, info porcupine.LinearizationInfo) string {
	partials := info.PartialLinearizations()
	var out []string
	for i, key := range keys {
		if i >= len(partials) {
			break
		}
		var longest []int
		for _, p := range partials[i] {
			if len(p) > len(longest) {
				longest = p
			}
		}
		if len(longest) >= len(parts[i]) {
			continue
		}
		in := map[int]bool{}
		for _, id := range longest {
			in[id] = true
		}
		first := -1
		for id := range parts[i] {
			if !in[id] && (first < 0 || parts[i][id].Call < parts[i][first].Call) {
				first = id
			}
		}
		out = append(out, fmt.Sprintf("key %s: %d of %d operations linearize; the earliest left out is %v",
			key, len(longest), len(parts[i]), parts[i][first].Metadata))
	}
	if len(out) == 0 {
		return "porcupine found no linearization"
	}
	return strings.Join(out, "; ")
}

// --- Resource versions ---

// observedRV is the greatest resourceVersion an answer showed: a written or read object's, or a list's.
func (o *Op) observedRV() int64 {
	if o.Outcome != OutcomeOK {
		return 0
	}
	rv := o.RV
	for _, it := range o.Items {
		rv = max(rv, it.RV)
	}
	return rv
}

// maxObservedBefore answers "the greatest resourceVersion any answer received before time t showed".
type maxObservedBefore struct {
	returns []time.Duration
	maxRV   []int64 // maxRV[i]: over the answers returns[0..i]
}

func newMaxObservedBefore(h *History) *maxObservedBefore {
	var idx []int
	for i := range h.Ops {
		if h.Ops[i].observedRV() > 0 {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return h.Ops[idx[a]].Return < h.Ops[idx[b]].Return })
	m := &maxObservedBefore{}
	var cur int64
	for _, i := range idx {
		cur = max(cur, h.Ops[i].observedRV())
		m.returns = append(m.returns, h.Ops[i].Return)
		m.maxRV = append(m.maxRV, cur)
	}
	return m
}

// at is the greatest resourceVersion of answers that returned strictly before t, and 0 if none did.
func (m *maxObservedBefore) at(t time.Duration) int64 {
	n := sort.Search(len(m.returns), func(i int) bool { return m.returns[i] >= t })
	if n == 0 {
		return 0
	}
	return m.maxRV[n-1]
}

// CheckRevisions checks the resourceVersions of the answers: every acknowledged create and update has
// one; one resourceVersion is never two versions (two keys, or two values of a key), and one written value
// never has two resourceVersions; and every acknowledged write's resourceVersion is greater than every
// resourceVersion any answer showed before the write was sent (the store's revision only grows).
func CheckRevisions(h *History) error {
	var v violations
	type version struct {
		key, value string
		op         int
	}
	byRV := map[int64]version{}
	rvOfValue := map[[2]string]version{}
	note := func(i int, key, value string, rv int64) {
		if old, ok := byRV[rv]; ok && (old.key != key || old.value != value) {
			v.addf("resourceVersion %d is %s=%s in op %d (%s) and %s=%s in op %d (%s)",
				rv, old.key, old.value, old.op, &h.Ops[old.op], key, value, i, &h.Ops[i])
		} else if !ok {
			byRV[rv] = version{key, value, i}
		}
		kv := [2]string{key, value}
		if old, ok := rvOfValue[kv]; ok && h.Ops[old.op].versionRV(key) != rv {
			v.addf("%s=%s has resourceVersion %d in op %d (%s) and %d in op %d (%s)",
				key, value, h.Ops[old.op].versionRV(key), old.op, &h.Ops[old.op], rv, i, &h.Ops[i])
		} else if !ok {
			rvOfValue[kv] = version{key, value, i}
		}
	}
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Outcome != OutcomeOK {
			continue
		}
		switch {
		case op.acked():
			if op.RV <= 0 {
				v.addf("op %d (%s) was acknowledged without a resourceVersion", i, op)
				continue
			}
			if op.ReadValue != "" && op.ReadValue != op.Value {
				v.addf("op %d (%s) was answered with value %s", i, op, op.ReadValue)
			}
			note(i, op.Key, op.Value, op.RV)
		case op.Kind == OpGet && op.Found:
			note(i, op.Key, op.ReadValue, op.RV)
		case op.Kind == OpList:
			for _, it := range op.Items {
				note(i, it.Key, it.Value, it.RV)
			}
		}
	}

	before := newMaxObservedBefore(h)
	for i := range h.Ops {
		op := &h.Ops[i]
		if !op.acked() || op.RV <= 0 {
			continue
		}
		if prev := before.at(op.Call); op.RV <= prev {
			v.addf("op %d (%s) got resourceVersion %d, but resourceVersion %d was seen before it was sent", i, op, op.RV, prev)
		}
	}
	return v.err("resourceVersion violations")
}

// versionRV is the resourceVersion the op's answer gave the key.
func (o *Op) versionRV(key string) int64 {
	if o.Kind != OpList {
		return o.RV
	}
	for _, it := range o.Items {
		if it.Key == key {
			return it.RV
		}
	}
	return 0
}

// --- Lists ---

// keyFacts indexes what the history shows of one key, for the list checks.
type keyFacts struct {
	// acked: acknowledged creates and updates ordered by return, with the running greatest resourceVersion.
	ackedReturn []time.Duration
	ackedMaxRV  []int64
	// deleted: acknowledged deletes ordered by return, with the running greatest precondition.
	deletedReturn []time.Duration
	deletedMaxPre []int64
	// versions: every resourceVersion the key is known to have had, ascending.
	versions []int64
	// deleteCall: for each precondition of a delete that succeeded or may have, its earliest call.
	deleteCall map[int64]time.Duration
}

func indexKeys(h *History) map[string]*keyFacts {
	facts := map[string]*keyFacts{}
	get := func(k string) *keyFacts {
		f := facts[k]
		if f == nil {
			f = &keyFacts{deleteCall: map[int64]time.Duration{}}
			facts[k] = f
		}
		return f
	}
	var acked, deleted []int
	versions := map[string]map[int64]bool{}
	addVersion := func(k string, rv int64) {
		if versions[k] == nil {
			versions[k] = map[int64]bool{}
		}
		versions[k][rv] = true
	}
	for i := range h.Ops {
		op := &h.Ops[i]
		switch {
		case op.acked():
			acked = append(acked, i)
			addVersion(op.Key, op.RV)
		case op.Kind == OpGet && op.Outcome == OutcomeOK && op.Found:
			addVersion(op.Key, op.RV)
		case op.Kind == OpList && op.Outcome == OutcomeOK:
			for _, it := range op.Items {
				addVersion(it.Key, it.RV)
			}
		case op.Kind == OpDelete && op.Outcome != OutcomeFailed:
			f := get(op.Key)
			if c, ok := f.deleteCall[op.PreconditionRV]; !ok || op.Call < c {
				f.deleteCall[op.PreconditionRV] = op.Call
			}
			if op.Outcome == OutcomeOK {
				deleted = append(deleted, i)
			}
		}
	}
	byReturn := func(idx []int) {
		sort.Slice(idx, func(a, b int) bool { return h.Ops[idx[a]].Return < h.Ops[idx[b]].Return })
	}
	byReturn(acked)
	byReturn(deleted)
	for _, i := range acked {
		op := &h.Ops[i]
		f := get(op.Key)
		prev := int64(0)
		if n := len(f.ackedMaxRV); n > 0 {
			prev = f.ackedMaxRV[n-1]
		}
		f.ackedReturn = append(f.ackedReturn, op.Return)
		f.ackedMaxRV = append(f.ackedMaxRV, max(prev, op.RV))
	}
	for _, i := range deleted {
		op := &h.Ops[i]
		f := get(op.Key)
		prev := int64(0)
		if n := len(f.deletedMaxPre); n > 0 {
			prev = f.deletedMaxPre[n-1]
		}
		f.deletedReturn = append(f.deletedReturn, op.Return)
		f.deletedMaxPre = append(f.deletedMaxPre, max(prev, op.PreconditionRV))
	}
	for k, set := range versions {
		f := get(k)
		for rv := range set {
			f.versions = append(f.versions, rv)
		}
		slices.Sort(f.versions)
	}
	return facts
}

// runningMaxBefore reads a running maximum at the last entry that returned strictly before t.
func runningMaxBefore(returns []time.Duration, maxes []int64, t time.Duration) int64 {
	n := sort.Search(len(returns), func(i int) bool { return returns[i] >= t })
	if n == 0 {
		return 0
	}
	return maxes[n-1]
}

// CheckListFreshness checks every successful consistent list (resourceVersion ""):
//
//   - fresh: its resourceVersion is at least every resourceVersion any answer showed before the list was
//     sent; it shows, of each key, the latest acknowledged version written before it was sent or a later
//     one, and not a version whose delete was acknowledged before it was sent; a key with an acknowledged
//     version it does not show has a delete of that version or a later one, sent before the list returned;
//   - a snapshot at its resourceVersion L: no object in it is newer than L; of each key it shows, no
//     version known from the history lies between the one shown and L; and of each key it does not show,
//     the latest known version up to L has a delete (acknowledged or unknown) sent before the list returned.
func CheckListFreshness(h *History) error {
	var v violations
	facts := indexKeys(h)
	keys := make([]string, 0, len(facts))
	for k := range facts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	before := newMaxObservedBefore(h)
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Kind != OpList || op.Outcome != OutcomeOK {
			continue
		}
		if prev := before.at(op.Call); op.RV < prev {
			v.addf("op %d (%s) has resourceVersion %d, older than %d seen before it was sent", i, op, op.RV, prev)
		}
		items := map[string]Item{}
		for _, it := range op.Items {
			items[it.Key] = it
			if it.RV > op.RV {
				v.addf("op %d (%s) shows %s at resourceVersion %d, newer than the list", i, op, it.Key, it.RV)
			}
		}
		for _, k := range keys {
			f := facts[k]
			it, shown := items[k]
			lastAcked := runningMaxBefore(f.ackedReturn, f.ackedMaxRV, op.Call)
			lastDeleted := runningMaxBefore(f.deletedReturn, f.deletedMaxPre, op.Call)
			// The latest known version up to the list's resourceVersion.
			n := sort.Search(len(f.versions), func(j int) bool { return f.versions[j] > op.RV })
			latest := int64(0)
			if n > 0 {
				latest = f.versions[n-1]
			}
			if shown {
				if it.RV < lastAcked {
					v.addf("op %d (%s) shows %s at resourceVersion %d, but %d was acknowledged before it was sent", i, op, k, it.RV, lastAcked)
				}
				if it.RV <= lastDeleted {
					v.addf("op %d (%s) shows %s at resourceVersion %d, but the delete of %d was acknowledged before it was sent", i, op, k, it.RV, lastDeleted)
				}
				if latest > it.RV {
					v.addf("op %d (%s) shows %s at resourceVersion %d, but it had version %d by the list's resourceVersion %d", i, op, k, it.RV, latest, op.RV)
				}
				continue
			}
			if lastAcked > lastDeleted && !deletedBefore(f, lastAcked, math.MaxInt64, op.Return) {
				v.addf("op %d (%s) does not show %s, but version %d was acknowledged before it was sent and no delete of it or a later version was sent before it returned", i, op, k, lastAcked)
			}
			if latest != 0 && !deletedBefore(f, latest, latest, op.Return) {
				v.addf("op %d (%s) does not show %s, whose version %d precedes the list's resourceVersion %d and had no delete sent before the list returned", i, op, k, latest, op.RV)
			}
		}
	}
	return v.err("list violations")
}

// deletedBefore is whether a delete that succeeded or may have, with a precondition in [lo, hi], was sent
// before t.
func deletedBefore(f *keyFacts, lo, hi int64, t time.Duration) bool {
	for pre, call := range f.deleteCall {
		if pre >= lo && pre <= hi && call < t {
			return true
		}
	}
	return false
}

// --- Lost writes ---

// CheckNoLostWrites checks the final state (Traffic.ReadFinal, read after the faults are healed) against
// the history. A version is an acknowledged create or update (key, value, resourceVersion); it is replaced
// if an update or delete with its resourceVersion as the precondition succeeded or may have (unknown).
//
//   - A version not replaced is the key's final object: same value and resourceVersion.
//   - A version replaced by an acknowledged request is not the final object.
//   - The final object of a key has a resourceVersion at least that of every acknowledged version of it.
//   - Every final object holds a value some create or update of the key wrote (acknowledged, or unknown),
//     with the acknowledged resourceVersion if it was acknowledged.
func CheckNoLostWrites(h *History, final map[string]FinalObject) error {
	var v violations
	type pre struct {
		key string
		rv  int64
	}
	replaced := map[pre]Outcome{} // OutcomeOK wins over OutcomeUnknown
	type write struct {
		op int
		ok bool
	}
	written := map[[2]string]write{}
	for i := range h.Ops {
		op := &h.Ops[i]
		if (op.Kind == OpUpdate || op.Kind == OpDelete) && op.Outcome != OutcomeFailed {
			p := pre{op.Key, op.PreconditionRV}
			if replaced[p] != OutcomeOK {
				replaced[p] = op.Outcome
			}
		}
		if (op.Kind == OpCreate || op.Kind == OpUpdate) && op.Outcome != OutcomeFailed {
			kv := [2]string{op.Key, op.Value}
			if w, ok := written[kv]; !ok || !w.ok {
				written[kv] = write{i, op.Outcome == OutcomeOK}
			}
		}
	}
	for i := range h.Ops {
		op := &h.Ops[i]
		if !op.acked() {
			continue
		}
		fo, present := final[op.Key]
		by, isReplaced := replaced[pre{op.Key, op.RV}]
		switch {
		case !isReplaced && !present:
			v.addf("op %d (%s) was acknowledged and never replaced, but %s is gone", i, op, op.Key)
		case !isReplaced && (fo.RV != op.RV || fo.Value != op.Value):
			v.addf("op %d (%s) was acknowledged and never replaced, but %s is %s at resourceVersion %d", i, op, op.Key, fo.Value, fo.RV)
		case by == OutcomeOK && present && fo.RV == op.RV:
			v.addf("op %d (%s) was replaced by an acknowledged request, but %s is still %s at resourceVersion %d", i, op, op.Key, fo.Value, fo.RV)
		case present && fo.RV < op.RV:
			v.addf("op %d (%s) was acknowledged, but %s ended at older resourceVersion %d (%s)", i, op, op.Key, fo.RV, fo.Value)
		}
	}
	names := make([]string, 0, len(final))
	for k := range final {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fo := final[k]
		w, ok := written[[2]string{k, fo.Value}]
		switch {
		case !ok:
			v.addf("final %s=%s (resourceVersion %d) was never written", k, fo.Value, fo.RV)
		case w.ok && h.Ops[w.op].RV != fo.RV:
			v.addf("final %s=%s has resourceVersion %d, but op %d (%s) wrote it at %d", k, fo.Value, fo.RV, w.op, &h.Ops[w.op], h.Ops[w.op].RV)
		}
	}
	return v.err("lost or phantom writes")
}
