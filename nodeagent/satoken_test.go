package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestRefreshDeadline(t *testing.T) {
	issued := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name     string
		lifetime time.Duration
		want     time.Duration // after issued
	}{
		{"kube-api-access lifetime", 3607 * time.Second, 2885600 * time.Millisecond},
		{"the least lifetime", 600 * time.Second, 480 * time.Second},
		{"a day", 24 * time.Hour, 19*time.Hour + 12*time.Minute},
		{"30 hours: 80% is 24 h", 30 * time.Hour, 24 * time.Hour},
		{"a year: a day at most", 365 * 24 * time.Hour, 24 * time.Hour},
	}
	for _, tc := range cases {
		if got := refreshDeadline(issued, tc.lifetime).Sub(issued); got != tc.want {
			t.Errorf("%s: refresh %v after issue, want %v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		given *int64
		want  int64
	}{{nil, 3600}, {ptr(int64(300)), 600}, {ptr(int64(600)), 600}, {ptr(int64(3607)), 3607}} {
		if got := tokenSeconds(tc.given); got != tc.want {
			t.Errorf("tokenSeconds(%v) = %d, want %d", tc.given, got, tc.want)
		}
	}
}

// fakeTokens is an objectGetter that also issues tokens "token-1", "token-2"..., recording the requests;
// fail makes the next requests fail.
type fakeTokens struct {
	*fakeObjects
	mu       sync.Mutex
	requests []string // "namespace/serviceAccount: bound kind name uid, seconds, audiences"
	issued   int
	fail     error
}

func (f *fakeTokens) RequestToken(_ context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ref := req.Spec.BoundObjectRef
	f.requests = append(f.requests, fmt.Sprintf("%s/%s: %s %s %s %s, %d, %v", namespace, serviceAccount, ref.APIVersion, ref.Kind, ref.Name, ref.UID,
		*req.Spec.ExpirationSeconds, req.Spec.Audiences))
	if f.fail != nil {
		return nil, f.fail
	}
	f.issued++
	out := req.DeepCopy()
	out.Status.Token = fmt.Sprintf("token-%d", f.issued)
	return out, nil
}

func (f *fakeTokens) requested() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// fakeTimer is an armed timer of fakeTimers.
type fakeTimer struct {
	after   time.Duration
	fire    func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { t.stopped = true; return true }

// run fires the timer, which is then spent.
func (t *fakeTimer) run() {
	t.stopped = true
	t.fire()
}

// fakeTimers replaces projectedTokens for a test with a manager on a fake clock whose timers fire only when
// the test says.
type fakeTimers struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

func useFakeTimers(t *testing.T) *fakeTimers {
	f := &fakeTimers{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	m := newTokenManager()
	m.now = func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }
	m.afterFunc = func(d time.Duration, fire func()) stopper {
		f.mu.Lock()
		defer f.mu.Unlock()
		timer := &fakeTimer{after: d, fire: fire}
		f.timers = append(f.timers, timer)
		return timer
	}
	saved := projectedTokens
	projectedTokens = m
	t.Cleanup(func() { projectedTokens = saved })
	return f
}

func (f *fakeTimers) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// armed lists the timers neither stopped nor fired.
func (f *fakeTimers) armed() []*fakeTimer {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*fakeTimer
	for _, t := range f.timers {
		if !t.stopped {
			out = append(out, t)
		}
	}
	return out
}

// apiAccessVolume is the volume the ServiceAccount admission adds (apiserver.tokenVolumeSource).
func apiAccessVolume() corev1.Volume {
	return corev1.Volume{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr(int32(420)),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3607))}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}}}
}

func TestServiceAccountTokenVolume(t *testing.T) {
	requireRoot(t)
	clock := useFakeTimers(t)
	objs := &fakeTokens{fakeObjects: newFakeObjects()}
	objs.addConfigMap("ns", "kube-root-ca.crt", map[string]string{"ca.crt": "CA"}, nil)
	podDir := t.TempDir()
	pod := testPod(apiAccessVolume())
	vols, err := setupT(t, pod, podDir, objs)
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["kube-api-access-abcde"]
	if !isTmpfs(t, dir) {
		t.Error("the token volume is not on a tmpfs")
	}
	files := func(token string) map[string]string {
		return map[string]string{"token": "-rw-r--r-- " + token, "ca.crt": "-rw-r--r-- CA", "namespace": "-rw-r--r-- ns"}
	}
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, files("token-1")) {
		t.Fatalf("files %q, want %q", got, files("token-1"))
	}
	// Bound to the pod, for the lifetime the projection asks, for the API's own audience.
	wantRequest := "ns/sa: v1 Pod web-0 uid-1, 3607, []"
	if got := objs.requested(); !reflect.DeepEqual(got, []string{wantRequest}) {
		t.Fatalf("requests %q, want %q", got, wantRequest)
	}
	armed := clock.armed()
	if len(armed) != 1 || armed[0].after != 2885600*time.Millisecond {
		t.Fatalf("timers %+v, want one at 80%% of 3607 s", armed)
	}

	// Syncs before the deadline use the token they have.
	clock.advance(40 * time.Minute)
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(objs.requested()); n != 1 || len(clock.armed()) != 1 {
		t.Fatalf("%d requests, %d timers after a sync before the deadline; want 1 and 1", n, len(clock.armed()))
	}

	// At the deadline the timer writes a new token, with the volume's other files as they stand.
	clock.advance(8*time.Minute + 6*time.Second)
	armed[0].run()
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, files("token-2")) {
		t.Fatalf("files after the refresh %q, want %q", got, files("token-2"))
	}
	next := clock.armed()
	if n := len(objs.requested()); n != 2 || len(next) != 1 || next[0] == armed[0] || next[0].after != 2885600*time.Millisecond {
		t.Fatalf("%d requests, timers %+v after the refresh; want 2 and a new one", n, next)
	}
	// The next sync keeps it.
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, files("token-2")) || len(objs.requested()) != 2 {
		t.Fatalf("after a sync: files %q, %d requests", got, len(objs.requested()))
	}

	// A refresh that fails is tried again soon, and the token in place serves meanwhile.
	objs.fail = errors.New("the API is away")
	clock.advance(49 * time.Minute)
	next[0].run()
	retry := clock.armed()
	if len(retry) != 1 || retry[0].after != tokenRetry {
		t.Fatalf("timers %+v after a failed refresh, want one retry after %v", retry, tokenRetry)
	}
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatalf("a sync with the refresh failing and the token still valid: %v", err)
	}
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, files("token-2")) {
		t.Fatalf("files %q while the API is away", got)
	}
	objs.fail = nil
	clock.advance(tokenRetry)
	retry[0].run()
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, files("token-3")) {
		t.Fatalf("files after the retry %q", got)
	}

	// When the pod's volumes go, so do its timers: a late one requests nothing.
	last := clock.armed()
	if err := teardownVolumes(podDir); err != nil {
		t.Fatal(err)
	}
	if n := len(clock.armed()); n != 0 {
		t.Fatalf("%d timers armed after teardown", n)
	}
	requests := len(objs.requested())
	last[0].run()
	if n := len(objs.requested()); n != requests {
		t.Errorf("a timer fired after teardown requested a token")
	}
	if n := len(projectedTokens.volumes); n != 0 {
		t.Errorf("%d token volumes kept after teardown", n)
	}
}

func TestServiceAccountTokenProjectionOptions(t *testing.T) {
	requireRoot(t)
	useFakeTimers(t)
	objs := &fakeTokens{fakeObjects: newFakeObjects()}
	pod := testPod(corev1.Volume{Name: "vault", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "vault/token", Audience: "vault", ExpirationSeconds: ptr(int64(60))}},
		},
	}}})
	gid := int64(3000)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: &gid}
	vols, err := setupT(t, pod, t.TempDir(), objs)
	if err != nil {
		t.Fatal(err)
	}
	// The audience as given; at least ten minutes; with an fsGroup, readable by owner and group only.
	if got, want := objs.requested(), []string{"ns/sa: v1 Pod web-0 uid-1, 600, [vault]"}; !reflect.DeepEqual(got, want) {
		t.Errorf("requests %q, want %q", got, want)
	}
	if got, want := visibleFiles(t, vols["vault"]), map[string]string{"vault/token": "-rw-r----- token-1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("files %q, want %q", got, want)
	}

	// Without a way to request tokens, the volume cannot be made.
	_, err = setupT(t, testPod(apiAccessVolume()), t.TempDir(), newFakeObjects())
	if err == nil || !strings.Contains(err.Error(), "this node cannot request service account tokens") {
		t.Errorf("a getter without tokens: %v", err)
	}
	// A refused request fails the volume, as the kubelet's FailedMount.
	objs.fail = errors.New(`serviceaccounts "sa" not found`)
	_, err = setupT(t, testPod(apiAccessVolume()), t.TempDir(), objs)
	if err == nil || !strings.Contains(err.Error(), `volume "kube-api-access-abcde": requesting a token for service account "sa": serviceaccounts "sa" not found`) {
		t.Errorf("a refused token request: %v", err)
	}
}
