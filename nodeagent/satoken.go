package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Service account tokens of projected volumes (serviceAccountToken sources), kept as the kubelet's token
// manager keeps them. Each token is requested from the TokenRequest API bound to its pod (so it dies with the
// pod), written with the rest of its volume, and replaced once 80% of its lifetime has passed, or a day after
// it was issued if that comes first. Every token has one timer, armed for that moment: when it fires, a new
// token is requested and the volume is written again, atomically, with the other files as they stand. A sync
// of the pod between two refreshes reuses the token it has. The timers stop when the pod's volumes are torn
// down, and when the agent stops.

// tokenRequester asks the API for a service account token (the serviceaccounts/token subresource). The
// agent's apiObjects is one; a node without one cannot run pods with token projections.
type tokenRequester interface {
	RequestToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error)
}

// RequestToken asks the API for a token; NodeRestriction lets a node ask only for tokens bound to its pods.
func (o apiObjects) RequestToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return o.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, req, metav1.CreateOptions{})
}

const (
	// minTokenSeconds is the least lifetime the TokenRequest API grants; a projection asking for less gets it.
	minTokenSeconds = 600
	// defaultTokenSeconds is the lifetime of a projection that names none, as Kubernetes defaults it.
	defaultTokenSeconds = 3600
	// maxTokenAge is how long a token is used at most, whatever its lifetime.
	maxTokenAge = 24 * time.Hour
	// tokenRequestTimeout bounds one TokenRequest of a refresh.
	tokenRequestTimeout = 30 * time.Second
	// A failed refresh is tried again after tokenRetry, doubling up to tokenRetryMax.
	tokenRetry    = 5 * time.Second
	tokenRetryMax = 2 * time.Minute
)

// refreshDeadline is when a token issued at issued for lifetime must be replaced: once 80% of its lifetime
// has passed, or a day after it was issued, whichever comes first (the kubelet's rule).
func refreshDeadline(issued time.Time, lifetime time.Duration) time.Time {
	return issued.Add(min(lifetime*8/10, maxTokenAge))
}

// tokenSeconds is the lifetime a projection asks for: as given, but at least minTokenSeconds.
func tokenSeconds(expirationSeconds *int64) int64 {
	if expirationSeconds == nil {
		return defaultTokenSeconds
	}
	return max(*expirationSeconds, minTokenSeconds)
}

// tokenSpec is what a token is for: one serviceAccountToken source of a pod's projected volume.
type tokenSpec struct {
	namespace, serviceAccount string
	podName                   string
	podUID                    types.UID
	audience                  string // "" for the API's own audience
	seconds                   int64
	path                      string // in the volume
	mode                      fs.FileMode
}

func newTokenSpec(pod *corev1.Pod, tp *corev1.ServiceAccountTokenProjection, mode fs.FileMode) tokenSpec {
	return tokenSpec{namespace: pod.Namespace, serviceAccount: pod.Spec.ServiceAccountName, podName: pod.Name, podUID: pod.UID,
		audience: tp.Audience, seconds: tokenSeconds(tp.ExpirationSeconds), path: path.Clean(tp.Path), mode: mode}
}

// request is the TokenRequest for the spec: bound to the pod by name and UID.
func (s tokenSpec) request() *authenticationv1.TokenRequest {
	seconds := s.seconds
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &seconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: s.podName, UID: s.podUID},
	}}
	if s.audience != "" {
		req.Spec.Audiences = []string{s.audience}
	}
	return req
}

// issuedToken is a token the API issued for a spec, and when it is to be replaced.
type issuedToken struct {
	spec      tokenSpec
	token     []byte
	expires   time.Time // as this node's clock sees it
	refreshAt time.Time
	timer     stopper
	failures  int // refreshes that failed in a row
}

// stopper is a timer: a *time.Timer, or the tests' fake.
type stopper interface{ Stop() bool }

// tokenManager holds the tokens of every projected volume of the agent's pods, by the volume's directory.
type tokenManager struct {
	now       func() time.Time
	afterFunc func(d time.Duration, f func()) stopper

	mu      sync.Mutex
	volumes map[string]*tokenVolume
}

// projectedTokens is the agent's token manager. A volume's directory is under its agent's data dir, so
// agents sharing a process (tests) never share an entry.
var projectedTokens = newTokenManager()

func newTokenManager() *tokenManager {
	return &tokenManager{now: time.Now, volumes: map[string]*tokenVolume{},
		afterFunc: func(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }}
}

// tokenVolume is the tokens of one projected volume. Its lock is held while the volume is written, by a sync
// or by a refresh, so that a sync never writes back a token a refresh has just replaced.
type tokenVolume struct {
	m         *tokenManager
	dir       string
	ctx       context.Context // the agent's: when it ends, the refreshes stop
	requester tokenRequester
	stopWatch func() bool // ends the watch on ctx

	mu      sync.Mutex
	fsGroup *int64               // the pod's, as the last sync wrote the volume with it
	tokens  map[int]*issuedToken // by the index of the source
	gone    bool
}

// volume returns the token volume at dir, made on first use. ctx is the agent's.
func (m *tokenManager) volume(ctx context.Context, dir string, requester tokenRequester) *tokenVolume {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.volumes[dir]; ok {
		return v
	}
	v := &tokenVolume{m: m, dir: dir, ctx: ctx, requester: requester, tokens: map[int]*issuedToken{}}
	v.stopWatch = context.AfterFunc(ctx, func() { m.forgetVolume(dir) })
	m.volumes[dir] = v
	return v
}

// forget stops the refreshes of every token volume of the pod whose directory is podDir: its volumes are
// being torn down.
func (m *tokenManager) forget(podDir string) {
	prefix := filepath.Join(podDir, volumesDirName) + string(filepath.Separator)
	m.mu.Lock()
	var dirs []string
	for dir := range m.volumes {
		if strings.HasPrefix(dir, prefix) {
			dirs = append(dirs, dir)
		}
	}
	m.mu.Unlock()
	for _, dir := range dirs {
		m.forgetVolume(dir)
	}
}

func (m *tokenManager) forgetVolume(dir string) {
	m.mu.Lock()
	v, ok := m.volumes[dir]
	delete(m.volumes, dir)
	m.mu.Unlock()
	if !ok {
		return
	}
	v.stopWatch()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gone = true
	for _, t := range v.tokens {
		t.timer.Stop()
	}
}

// token is the token for source i, for a sync that holds v.mu: the one it has while it is not due for
// refresh, otherwise a new one. When a new one cannot be had, the old one serves while it is valid.
func (v *tokenVolume) token(ctx context.Context, i int, spec tokenSpec) ([]byte, error) {
	now := v.m.now()
	old := v.tokens[i]
	if old != nil && old.spec == spec && now.Before(old.refreshAt) {
		return old.token, nil
	}
	fresh, err := v.request(ctx, spec)
	if err != nil {
		if old != nil && old.spec == spec && now.Before(old.expires) {
			return old.token, nil // its timer retries
		}
		return nil, err
	}
	v.store(i, fresh)
	return fresh.token, nil
}

// request asks the API for a token for spec.
func (v *tokenVolume) request(ctx context.Context, spec tokenSpec) (*issuedToken, error) {
	tr, err := v.requester.RequestToken(ctx, spec.namespace, spec.serviceAccount, spec.request())
	if err != nil {
		return nil, fmt.Errorf("requesting a token for service account %q: %w", spec.serviceAccount, err)
	}
	if tr.Status.Token == "" {
		return nil, fmt.Errorf("requesting a token for service account %q: the API returned no token", spec.serviceAccount)
	}
	// The lifetime the API granted, counted on this node's clock from now: a clock apart from the servers'
	// shifts the expiry time, not the lifetime.
	seconds := spec.seconds
	if s := tr.Spec.ExpirationSeconds; s != nil && *s > 0 {
		seconds = *s
	}
	lifetime := time.Duration(seconds) * time.Second
	issued := v.m.now()
	return &issuedToken{spec: spec, token: []byte(tr.Status.Token), expires: issued.Add(lifetime),
		refreshAt: refreshDeadline(issued, lifetime)}, nil
}

// store keeps t as the token of source i, with v.mu held, and arms its timer.
func (v *tokenVolume) store(i int, t *issuedToken) {
	if old := v.tokens[i]; old != nil {
		old.timer.Stop()
	}
	v.tokens[i] = t
	v.arm(i, t, t.refreshAt.Sub(v.m.now()))
}

func (v *tokenVolume) arm(i int, t *issuedToken, after time.Duration) {
	t.timer = v.m.afterFunc(max(after, time.Second), func() { v.refresh(i, t) })
}

// refresh runs on t's timer: it asks for a new token for source i and writes it into the volume, with the
// other files as they stand. A failure is tried again after a backoff. It does nothing once the volume is
// forgotten or a sync has replaced t.
func (v *tokenVolume) refresh(i int, t *issuedToken) {
	if v.ctx.Err() != nil {
		return
	}
	v.mu.Lock()
	current := !v.gone && v.tokens[i] == t
	v.mu.Unlock()
	if !current {
		return
	}
	ctx, cancel := context.WithTimeout(v.ctx, tokenRequestTimeout)
	fresh, err := v.request(ctx, t.spec)
	cancel()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gone || v.tokens[i] != t {
		return
	}
	if err != nil {
		t.failures++
		v.arm(i, t, min(tokenRetry<<min(t.failures-1, 8), tokenRetryMax))
		return
	}
	v.store(i, fresh)
	// The volume's other files stay as the last sync wrote them. A volume not written yet (its sync failed)
	// gets the new token from its next sync, as does one this write fails on.
	payload, err := readPayload(v.dir)
	if err != nil {
		return
	}
	payload[t.spec.path] = fileProjection{data: fresh.token, mode: t.spec.mode}
	_ = atomicWrite(v.dir, payload, v.fsGroup)
}

// readPayload reads back what atomicWrite last wrote in dir: the files under "..data", with their modes.
func readPayload(dir string) (map[string]fileProjection, error) {
	ts, err := os.Readlink(filepath.Join(dir, dataDirName))
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, ts)
	payload := map[string]fileProjection{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		payload[filepath.ToSlash(rel)] = fileProjection{data: data, mode: info.Mode().Perm()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(payload) == 0 {
		return nil, errors.New("empty payload")
	}
	return payload, nil
}
