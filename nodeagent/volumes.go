package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// objectGetter fetches the ConfigMaps and Secrets that volumes and env refer to. A missing object is
// reported with an error for which apierrors.IsNotFound is true.
type objectGetter interface {
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	RuntimeClass(ctx context.Context, name string) (*nodev1.RuntimeClass, error)
}

// podVolumes are a pod's prepared volumes: name → host directory (or file, for hostPath files).
type podVolumes map[string]string

// A pod's volumes live under <podDir>/volumes/<plugin>/<volume name>, named as the kubelet names them.
// containerMounts reads the plugin back from the path to mount configMap, secret, downwardAPI and projected
// volumes read-only, as the kubelet does whatever the volumeMount says.
const (
	volumesDirName    = "volumes"
	pluginEmptyDir    = "kubernetes.io~empty-dir"
	pluginConfigMap   = "kubernetes.io~configmap"
	pluginSecret      = "kubernetes.io~secret"
	pluginDownwardAPI = "kubernetes.io~downward-api"
	pluginProjected   = "kubernetes.io~projected"
	pluginImage       = "kubernetes.io~image"
)

// The kubelet's AtomicWriter layout: the payload lives in a timestamped directory "..<time>.<random>",
// "..data" points at the current one and each top-level name of the payload is a symlink "name -> ..data/name".
const (
	dataDirName    = "..data"
	dataDirTmpName = "..data_tmp"
)

// errNotSupported marks errors about what this node can never run (a volume kind, an emptyDir medium, a
// projection it lacks): retrying does not help, unlike for a missing ConfigMap or Secret.
var errNotSupported = errors.New("not supported by this node")

type notSupportedError struct{ msg string }

func (e *notSupportedError) Error() string        { return e.msg }
func (e *notSupportedError) Is(target error) bool { return target == errNotSupported }

func notSupported(format string, a ...any) error {
	return &notSupportedError{msg: fmt.Sprintf(format, a...)}
}

// missingObjectError is a ConfigMap or Secret that is not there, worded as the kubelet words it
// (`configmap "x" not found`); it unwraps to the getter's NotFound, so apierrors.IsNotFound holds.
type missingObjectError struct {
	kind, name string
	err        error
}

func (e *missingObjectError) Error() string { return fmt.Sprintf("%s %q not found", e.kind, e.name) }
func (e *missingObjectError) Unwrap() error { return e.err }

// getConfigMap fetches a ConfigMap; a missing optional one is an empty ConfigMap.
func getConfigMap(ctx context.Context, get objectGetter, namespace, name string, optional bool) (*corev1.ConfigMap, error) {
	cm, err := get.ConfigMap(ctx, namespace, name)
	switch {
	case err == nil && cm != nil:
		return cm, nil
	case err == nil || apierrors.IsNotFound(err):
		if optional {
			return &corev1.ConfigMap{}, nil
		}
		return nil, &missingObjectError{kind: "configmap", name: name, err: err}
	default:
		return nil, fmt.Errorf("getting configmap %q: %w", name, err)
	}
}

// getSecret fetches a Secret; a missing optional one is an empty Secret.
func getSecret(ctx context.Context, get objectGetter, namespace, name string, optional bool) (*corev1.Secret, error) {
	s, err := get.Secret(ctx, namespace, name)
	switch {
	case err == nil && s != nil:
		return s, nil
	case err == nil || apierrors.IsNotFound(err):
		if optional {
			return &corev1.Secret{}, nil
		}
		return nil, &missingObjectError{kind: "secret", name: name, err: err}
	default:
		return nil, fmt.Errorf("getting secret %q: %w", name, err)
	}
}

// setupVolumes prepares every volume of the pod under podDir (e.g. <data_dir>/pods/<uid>): it is idempotent
// and is called on every sync, so that configMap/secret/downwardAPI contents follow their sources
// (write atomically, as the kubelet's AtomicWriter does: a timestamped dir + `..data` symlink swapped with rename,
// and per-key symlinks `key -> ..data/key`).
//
// A pod using a volume kind this node lacks fails before anything is made, with an error for which
// errors.Is(err, errNotSupported) holds (the pod can never run here). Otherwise every volume is set up that
// can be, and the failures are joined (one line each), each naming its volume as the kubelet's FailedMount
// events do (`volume "cfg": configmap "x" not found`, for an event "MountVolume.SetUp failed: ..."); a missing
// ConfigMap or Secret satisfies apierrors.IsNotFound and is worth retrying. The volumes that were set up are returned either way.
// Secret and projected volumes, like memory-backed emptyDirs, are tmpfs mounts, so that secrets never reach
// the disk; that needs CAP_SYS_ADMIN. It must not run concurrently for the same pod.
//
// A projected serviceAccountToken source needs a getter that is also a tokenRequester; its token is requested
// bound to the pod and then kept fresh between syncs (satoken.go). ctx is the agent's: the tokens stop being
// refreshed when it ends, or when teardownVolumes removes the pod's volumes.
//
// allocatable is the Node's, as its status reports it: a downwardAPI item reads a container's unset cpu,
// memory or ephemeral-storage limit as that, as the kubelet's volume plugin does (GetNodeAllocatable).
func setupVolumes(ctx context.Context, pod *corev1.Pod, podDir string, get objectGetter, allocatable corev1.ResourceList, images imageMounter) (podVolumes, error) {
	certs := certificateSourceOf(get)
	for i := range pod.Spec.Volumes {
		if err := checkVolumeSupported(i, &pod.Spec.Volumes[i], certs != nil, images != nil); err != nil {
			return nil, err
		}
	}
	root := filepath.Join(podDir, volumesDirName)
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, err
	}
	claims, _ := get.(claimResolver)
	s := &volumeSetup{ctx: ctx, pod: pod, root: root, get: newCachingGetter(get), tokens: tokenRequesterOf(get), claims: claims, certs: certs,
		allocatable: allocatable, images: images}
	vols := podVolumes{}
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		p, err := s.setup(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("volume %q: %w", v.Name, err))
			continue
		}
		vols[v.Name] = p
	}
	return vols, errors.Join(errs...)
}

// checkVolumeSupported rejects what this node cannot set up, naming the field; certificates says whether it
// serves clusterTrustBundle and podCertificate projections (certificates.go).
func checkVolumeSupported(i int, v *corev1.Volume, certificates, images bool) error {
	src := &v.VolumeSource
	switch {
	case src.Image != nil && images:
	case src.CSI != nil:
		// As the kubelet words it when no CSI driver of that name registered on the node: this agent runs
		// none (the API keeps such pods, and the pod waits here with a FailedMount event).
		return notSupported("spec.volumes[%d]: csi volume %q: driver name %s not found in the list of registered CSI drivers (this node runs no CSI drivers)", i, v.Name, src.CSI.Driver)
	case src.EmptyDir != nil:
		if m := src.EmptyDir.Medium; m != corev1.StorageMediumDefault && m != corev1.StorageMediumMemory {
			return notSupported("spec.volumes[%d].emptyDir.medium: %q is not supported by this node", i, m)
		}
	case src.HostPath != nil:
		if !filepath.IsAbs(src.HostPath.Path) {
			return fmt.Errorf("spec.volumes[%d].hostPath.path: %q is not an absolute path", i, src.HostPath.Path)
		}
		if t := src.HostPath.Type; t != nil {
			switch *t {
			case corev1.HostPathUnset, corev1.HostPathDirectoryOrCreate, corev1.HostPathDirectory,
				corev1.HostPathFileOrCreate, corev1.HostPathFile, corev1.HostPathSocket,
				corev1.HostPathCharDev, corev1.HostPathBlockDev:
			default:
				return fmt.Errorf("spec.volumes[%d].hostPath.type: %s is an invalid volume type", i, *t)
			}
		}
	case src.ConfigMap != nil, src.Secret != nil, src.PersistentVolumeClaim != nil:
	case src.DownwardAPI != nil:
		for j, item := range src.DownwardAPI.Items {
			if item.ResourceFieldRef != nil && item.ResourceFieldRef.ContainerName == "" {
				return fmt.Errorf("spec.volumes[%d].downwardAPI.items[%d].resourceFieldRef.containerName: Required value", i, j)
			}
		}
	case src.Projected != nil:
		for j, ps := range src.Projected.Sources {
			switch {
			case ps.ServiceAccountToken != nil:
				if ps.ServiceAccountToken.Path == "" {
					return fmt.Errorf("spec.volumes[%d].projected.sources[%d].serviceAccountToken.path: Required value", i, j)
				}
			case ps.ConfigMap != nil, ps.Secret != nil:
			case (ps.ClusterTrustBundle != nil || ps.PodCertificate != nil) && certificates:
				if err := checkCertificateProjection(i, j, &ps); err != nil {
					return err
				}
			case ps.DownwardAPI != nil:
				for k, item := range ps.DownwardAPI.Items {
					if item.ResourceFieldRef != nil && item.ResourceFieldRef.ContainerName == "" {
						return fmt.Errorf("spec.volumes[%d].projected.sources[%d].downwardAPI.items[%d].resourceFieldRef.containerName: Required value", i, j, k)
					}
				}
			default:
				if name := setFieldName(reflect.ValueOf(ps)); name != "" {
					return notSupported("spec.volumes[%d].projected.sources[%d]: %s projections are not supported by this node", i, j, name)
				}
				return fmt.Errorf("spec.volumes[%d].projected.sources[%d]: no projection source is set", i, j)
			}
		}
	default:
		if name := setFieldName(reflect.ValueOf(*src)); name != "" {
			return notSupported("spec.volumes[%d]: %s volumes are not supported by this node", i, name)
		}
		return fmt.Errorf("spec.volumes[%d]: no volume source is set", i)
	}
	return nil
}

// setFieldName is the JSON name of the first non-nil pointer field of a struct, or "".
func setFieldName(v reflect.Value) string {
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return ""
}

// volumeSetup is one setupVolumes call.
type volumeSetup struct {
	ctx    context.Context
	pod    *corev1.Pod
	root   string
	get    objectGetter
	tokens tokenRequester    // nil when the getter cannot request service account tokens
	claims claimResolver     // nil when the getter cannot read claims and their volumes
	certs  certificateSource // nil when the getter serves no clusterTrustBundle or podCertificate sources
	// allocatable is what unset container limits read as in resourceFieldRef items: the Node's allocatable
	// as its status reports it, as the kubelet's downward API volumes use (nil: limits are not defaulted).
	allocatable corev1.ResourceList
	images      imageMounter // nil when the node mounts no image volumes
}

// imageMounter mounts an OCI image's filesystem, read-only, for an image volume (imagevolume.go).
type imageMounter interface {
	mountImageVolume(ctx context.Context, pod *corev1.Pod, name string, src *corev1.ImageVolumeSource, target string) error
}

// tokenRequesterOf is the getter as a tokenRequester, or nil.
func tokenRequesterOf(get objectGetter) tokenRequester {
	if c, ok := get.(*cachingGetter); ok {
		get = c.get
	}
	tokens, _ := get.(tokenRequester)
	return tokens
}

func (s *volumeSetup) fsGroup() *int64 {
	if sc := s.pod.Spec.SecurityContext; sc != nil {
		return sc.FSGroup
	}
	return nil
}

// setup prepares one volume and returns its host path.
func (s *volumeSetup) setup(v *corev1.Volume) (string, error) {
	src := &v.VolumeSource
	switch {
	case src.HostPath != nil:
		return src.HostPath.Path, checkHostPath(src.HostPath)
	case src.PersistentVolumeClaim != nil:
		return s.setupClaim(src.PersistentVolumeClaim.ClaimName)
	case src.Image != nil:
		dir := filepath.Join(s.root, pluginImage, v.Name)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return "", err
		}
		return dir, s.images.mountImageVolume(s.ctx, s.pod, v.Name, src.Image, dir)
	case src.EmptyDir != nil:
		return s.setupEmptyDir(v.Name, src.EmptyDir)
	case src.ConfigMap != nil:
		cm := src.ConfigMap
		optional := cm.Optional != nil && *cm.Optional
		obj, err := getConfigMap(s.ctx, s.get, s.pod.Namespace, cm.Name, optional)
		if err != nil {
			return "", err
		}
		payload, err := configMapPayload(obj, cm.Items, fileMode(cm.DefaultMode, 0o644), optional)
		if err != nil {
			return "", err
		}
		return s.writeVolume(pluginConfigMap, v.Name, false, payload)
	case src.Secret != nil:
		sec := src.Secret
		optional := sec.Optional != nil && *sec.Optional
		obj, err := getSecret(s.ctx, s.get, s.pod.Namespace, sec.SecretName, optional)
		if err != nil {
			return "", err
		}
		payload, err := secretPayload(obj, sec.Items, fileMode(sec.DefaultMode, 0o644), optional)
		if err != nil {
			return "", err
		}
		return s.writeVolume(pluginSecret, v.Name, true, payload)
	case src.DownwardAPI != nil:
		payload, err := s.downwardAPIPayload(src.DownwardAPI.Items, fileMode(src.DownwardAPI.DefaultMode, 0o644))
		if err != nil {
			return "", err
		}
		return s.writeVolume(pluginDownwardAPI, v.Name, false, payload)
	case src.Projected != nil:
		var tokens *tokenVolume
		if hasTokenSource(src.Projected) {
			if s.tokens == nil {
				return "", notSupported("this node cannot request service account tokens")
			}
			// Held until the volume is written: a refresh of its tokens waits for this sync.
			tokens = projectedTokens.volume(s.ctx, filepath.Join(s.root, pluginProjected, v.Name), s.tokens)
			tokens.mu.Lock()
			defer tokens.mu.Unlock()
			tokens.fsGroup = s.fsGroup()
		}
		payload, err := s.projectedPayload(v.Name, src.Projected, tokens)
		if err != nil {
			return "", err
		}
		return s.writeVolume(pluginProjected, v.Name, true, payload)
	}
	return "", fmt.Errorf("volume %q has no supported source", v.Name) // checkVolumeSupported ran first
}

// claimResolver finds the PersistentVolume a pod's claim is bound to.
type claimResolver interface {
	ClaimVolume(ctx context.Context, namespace, claim string) (*corev1.PersistentVolume, error)
}

// ClaimVolume reads a claim and the volume it is bound to; the Node authorizer lets a node read both once a
// pod bound to it names the claim. A claim not yet bound is an error the pod's sync retries.
func (o apiObjects) ClaimVolume(ctx context.Context, namespace, name string) (*corev1.PersistentVolume, error) {
	claim, err := o.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if claim.Spec.VolumeName == "" || claim.Status.Phase != corev1.ClaimBound {
		return nil, fmt.Errorf("persistentvolumeclaim %q is not bound yet (phase %s)", name, claim.Status.Phase)
	}
	pv, err := o.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != claim.UID {
		return nil, fmt.Errorf("persistentvolume %q is not bound to claim %q", pv.Name, name)
	}
	return pv, nil
}

// setupClaim is the host directory of the volume a claim is bound to: a local or hostPath volume (what
// Skiff's local-path class provisions, or an operator creates by hand). The directory is bind-mounted as it
// is, so its data outlives the pod.
func (s *volumeSetup) setupClaim(claim string) (string, error) {
	if s.claims == nil {
		return "", notSupported("this node cannot read persistent volume claims")
	}
	pv, err := s.claims.ClaimVolume(s.ctx, s.pod.Namespace, claim)
	if err != nil {
		return "", err
	}
	switch src := pv.Spec.PersistentVolumeSource; {
	case src.Local != nil:
		if _, err := os.Stat(src.Local.Path); err != nil {
			return "", fmt.Errorf("local volume %q: %w", pv.Name, err)
		}
		return src.Local.Path, nil
	case src.HostPath != nil:
		return src.HostPath.Path, checkHostPath(src.HostPath)
	}
	return "", notSupported("persistentvolume %q: only local and hostPath volumes are supported by this node", pv.Name)
}

// readOnlyClaimMounts is the container with its mounts of read-only claims (persistentVolumeClaim.readOnly)
// made read-only, as the kubelet mounts them.
func readOnlyClaimMounts(pod *corev1.Pod, c *corev1.Container) *corev1.Container {
	readOnly := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly {
			readOnly[v.Name] = true
		}
	}
	if len(readOnly) == 0 {
		return c
	}
	c = c.DeepCopy()
	for i := range c.VolumeMounts {
		if readOnly[c.VolumeMounts[i].Name] {
			c.VolumeMounts[i].ReadOnly = true
		}
	}
	return c
}

// checkHostPath makes and checks a hostPath as its type says, as the kubelet does.
func checkHostPath(hp *corev1.HostPathVolumeSource) error {
	t := corev1.HostPathUnset
	if hp.Type != nil {
		t = *hp.Type
	}
	p := hp.Path
	fi, statErr := os.Stat(p)
	exists := statErr == nil
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		return fmt.Errorf("hostPath type check failed: %w", statErr)
	}
	is := func(want fs.FileMode) bool { return exists && fi.Mode().Type() == want }
	switch t {
	case corev1.HostPathUnset:
		return nil
	case corev1.HostPathDirectoryOrCreate:
		if !exists {
			return os.MkdirAll(p, 0o755)
		}
		fallthrough
	case corev1.HostPathDirectory:
		if !is(fs.ModeDir) {
			return fmt.Errorf("hostPath type check failed: %s is not a directory", p)
		}
	case corev1.HostPathFileOrCreate:
		if !exists {
			f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
		fallthrough
	case corev1.HostPathFile:
		if !is(0) {
			return fmt.Errorf("hostPath type check failed: %s is not a file", p)
		}
	case corev1.HostPathSocket:
		if !is(fs.ModeSocket) {
			return fmt.Errorf("hostPath type check failed: %s is not a socket file", p)
		}
	case corev1.HostPathCharDev:
		if !is(fs.ModeDevice | fs.ModeCharDevice) {
			return fmt.Errorf("hostPath type check failed: %s is not a character device", p)
		}
	case corev1.HostPathBlockDev:
		if !is(fs.ModeDevice) {
			return fmt.Errorf("hostPath type check failed: %s is not a block device", p)
		}
	default:
		return fmt.Errorf("%s is an invalid volume type", t)
	}
	return nil
}

// setupEmptyDir makes an emptyDir: a world-writable directory, or for medium Memory a tmpfs mounted there.
// sizeLimit sizes the tmpfs; for a disk-backed emptyDir it is recorded in the spec but not enforced (the
// kubelet enforces it by evicting the pod, and this node has no eviction manager yet).
func (s *volumeSetup) setupEmptyDir(name string, ed *corev1.EmptyDirVolumeSource) (string, error) {
	dir := filepath.Join(s.root, pluginEmptyDir, name)
	created, err := makeVolumeDir(dir)
	if err != nil {
		return "", err
	}
	if ed.Medium == corev1.StorageMediumMemory {
		var size int64
		if ed.SizeLimit != nil && ed.SizeLimit.Sign() > 0 {
			size = ed.SizeLimit.Value()
		}
		if created, err = ensureTmpfs(dir, size); err != nil {
			return "", err
		}
	}
	if gid := s.fsGroup(); gid != nil && created {
		if err := chownToFSGroup(dir, *gid, false); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// makeVolumeDir makes a volume's directory, mode 0777 as the kubelet's emptyDir, and says whether it was new.
func makeVolumeDir(dir string) (bool, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o750); err != nil {
		return false, err
	}
	if err := os.Mkdir(dir, 0o777); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	return true, os.Chmod(dir, 0o777) // past the umask
}

// ensureTmpfs mounts a tmpfs on dir unless something is mounted there already, and says whether it mounted.
// size is in bytes; 0 leaves the kernel's default (half the RAM).
func ensureTmpfs(dir string, size int64) (bool, error) {
	mounted, err := isMountPoint(dir)
	if err != nil || mounted {
		return false, err
	}
	opts := ""
	if size > 0 {
		opts = "size=" + strconv.FormatInt(size, 10)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		return false, fmt.Errorf("mounting a tmpfs on %s: %w", dir, err)
	}
	return true, nil
}

// fileProjection is one file of an atomically written volume.
type fileProjection struct {
	data []byte
	mode fs.FileMode
}

func fileMode(m *int32, def fs.FileMode) fs.FileMode {
	if m == nil {
		return def
	}
	return fs.FileMode(*m) & fs.ModePerm
}

// configMapPayload is what a ConfigMap volume or projection holds: every key of data and binaryData, or
// just the items; an item whose key is missing is an error unless the source is optional.
func configMapPayload(cm *corev1.ConfigMap, items []corev1.KeyToPath, defaultMode fs.FileMode, optional bool) (map[string]fileProjection, error) {
	payload := map[string]fileProjection{}
	if len(items) == 0 {
		for k, v := range cm.Data {
			payload[k] = fileProjection{data: []byte(v), mode: defaultMode}
		}
		for k, v := range cm.BinaryData {
			payload[k] = fileProjection{data: v, mode: defaultMode}
		}
		return payload, nil
	}
	for _, item := range items {
		var data []byte
		if v, ok := cm.Data[item.Key]; ok {
			data = []byte(v)
		} else if v, ok := cm.BinaryData[item.Key]; ok {
			data = v
		} else if optional {
			continue
		} else {
			return nil, fmt.Errorf("configmap %q references non-existent config key: %s", cm.Name, item.Key)
		}
		payload[item.Path] = fileProjection{data: data, mode: fileMode(item.Mode, defaultMode)}
	}
	return payload, nil
}

// secretPayload is what a Secret volume or projection holds, as configMapPayload.
func secretPayload(s *corev1.Secret, items []corev1.KeyToPath, defaultMode fs.FileMode, optional bool) (map[string]fileProjection, error) {
	payload := map[string]fileProjection{}
	if len(items) == 0 {
		for k, v := range s.Data {
			payload[k] = fileProjection{data: v, mode: defaultMode}
		}
		return payload, nil
	}
	for _, item := range items {
		v, ok := s.Data[item.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("secret %q references non-existent secret key: %s", s.Name, item.Key)
		}
		payload[item.Path] = fileProjection{data: v, mode: fileMode(item.Mode, defaultMode)}
	}
	return payload, nil
}

// downwardAPIPayload is what a downwardAPI volume or projection holds.
func (s *volumeSetup) downwardAPIPayload(items []corev1.DownwardAPIVolumeFile, defaultMode fs.FileMode) (map[string]fileProjection, error) {
	payload := map[string]fileProjection{}
	var errs []error
	for _, item := range items {
		var value string
		var err error
		switch {
		case item.FieldRef != nil:
			value, err = volumeFieldValue(s.pod, item.FieldRef)
		case item.ResourceFieldRef != nil:
			value, err = resourceFieldValue(s.pod, nil, item.ResourceFieldRef, s.allocatable)
		default:
			err = fmt.Errorf("downwardAPI item %q has neither fieldRef nor resourceFieldRef", item.Path)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		payload[path.Clean(item.Path)] = fileProjection{data: []byte(value), mode: fileMode(item.Mode, defaultMode)}
	}
	return payload, errors.Join(errs...)
}

// hasTokenSource says whether a projected volume holds a service account token.
func hasTokenSource(p *corev1.ProjectedVolumeSource) bool {
	for _, src := range p.Sources {
		if src.ServiceAccountToken != nil {
			return true
		}
	}
	return false
}

// projectedPayload merges the sources of the projected volume name, later ones winning on the same path.
// tokens holds the volume's service account tokens (nil when it has none), locked by the caller.
func (s *volumeSetup) projectedPayload(name string, p *corev1.ProjectedVolumeSource, tokens *tokenVolume) (map[string]fileProjection, error) {
	defaultMode := fileMode(p.DefaultMode, 0o644)
	payload := map[string]fileProjection{}
	var errs []error
	for i, src := range p.Sources {
		var part map[string]fileProjection
		var err error
		switch {
		case src.ConfigMap != nil:
			optional := src.ConfigMap.Optional != nil && *src.ConfigMap.Optional
			var cm *corev1.ConfigMap
			if cm, err = getConfigMap(s.ctx, s.get, s.pod.Namespace, src.ConfigMap.Name, optional); err == nil {
				part, err = configMapPayload(cm, src.ConfigMap.Items, defaultMode, optional)
			}
		case src.Secret != nil:
			optional := src.Secret.Optional != nil && *src.Secret.Optional
			var sec *corev1.Secret
			if sec, err = getSecret(s.ctx, s.get, s.pod.Namespace, src.Secret.Name, optional); err == nil {
				part, err = secretPayload(sec, src.Secret.Items, defaultMode, optional)
			}
		case src.DownwardAPI != nil:
			part, err = s.downwardAPIPayload(src.DownwardAPI.Items, defaultMode)
		case src.ServiceAccountToken != nil:
			// As the kubelet does, a pod with an fsGroup gets its token readable by owner and group only.
			mode := defaultMode
			if s.fsGroup() != nil {
				mode = 0o600
			}
			spec := newTokenSpec(s.pod, src.ServiceAccountToken, mode)
			var token []byte
			if token, err = tokens.token(s.ctx, i, spec); err == nil {
				part = map[string]fileProjection{spec.path: {data: token, mode: mode}}
			}
		case src.ClusterTrustBundle != nil, src.PodCertificate != nil:
			part, err = s.certificatePayload(name, i, &src, defaultMode)
		default:
			err = errors.New("unsupported projection") // checkVolumeSupported ran first
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for k, v := range part {
			payload[path.Clean(k)] = v
		}
	}
	return payload, errors.Join(errs...)
}

// writeVolume makes the volume's directory (a tmpfs when inMemory) and writes the payload into it atomically.
func (s *volumeSetup) writeVolume(plugin, name string, inMemory bool, payload map[string]fileProjection) (string, error) {
	dir := filepath.Join(s.root, plugin, name)
	if _, err := makeVolumeDir(dir); err != nil {
		return "", err
	}
	if inMemory {
		if _, err := ensureTmpfs(dir, 0); err != nil {
			return "", err
		}
	}
	return dir, atomicWrite(dir, payload, s.fsGroup())
}

// atomicWrite makes dir hold exactly the payload, as the kubelet's AtomicWriter does: a reader sees either the
// old or the new payload whole. The files go into a new timestamped directory, "..data" is swapped to it with a
// rename, the top-level names are symlinks through "..data", and then stale names and the old directory go.
// When the files are already as the payload says, nothing is written. With an fsGroup, the files belong to
// that group and are group-readable, as the kubelet makes them for read-only volumes.
func atomicWrite(dir string, payload map[string]fileProjection, fsGroup *int64) error {
	clean := make(map[string]fileProjection, len(payload))
	for p, f := range payload {
		if err := validatePayloadPath(p); err != nil {
			return err
		}
		if fsGroup != nil {
			f.mode |= 0o440
		}
		clean[path.Clean(p)] = f
	}
	for p := range clean {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := clean[d]; ok {
				return fmt.Errorf("invalid payload: %s is both a file and a directory", d)
			}
		}
	}
	dataLink := filepath.Join(dir, dataDirName)
	oldTs, err := os.Readlink(dataLink)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if oldTs != "" && payloadWritten(filepath.Join(dir, oldTs), clean) {
		return linkUserVisible(dir, clean, fsGroup)
	}

	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	tsName := filepath.Base(tsDir)
	if err := writePayload(tsDir, clean, fsGroup); err != nil {
		os.RemoveAll(tsDir)
		return err
	}
	tmpLink := filepath.Join(dir, dataDirTmpName)
	if err := os.Remove(tmpLink); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(tsDir)
		return err
	}
	if err := os.Symlink(tsName, tmpLink); err != nil {
		os.RemoveAll(tsDir)
		return err
	}
	if fsGroup != nil {
		if err := os.Lchown(tmpLink, -1, int(*fsGroup)); err != nil {
			os.RemoveAll(tsDir)
			return err
		}
	}
	if err := os.Rename(tmpLink, dataLink); err != nil {
		os.RemoveAll(tsDir)
		return err
	}
	if err := linkUserVisible(dir, clean, fsGroup); err != nil {
		return err
	}
	// Remove the old payload directory, and any left behind by a crash between the steps above.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); e.IsDir() && strings.HasPrefix(n, "..") && n != tsName {
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// validatePayloadPath checks a path of a volume's payload as the kubelet's AtomicWriter does.
func validatePayloadPath(p string) error {
	switch {
	case p == "":
		return errors.New("invalid path: must not be empty")
	case path.IsAbs(p):
		return fmt.Errorf("invalid path: must be relative path: %s", p)
	case len(p) > 4096:
		return fmt.Errorf("invalid path: must be less than or equal to %d characters", 4096)
	case path.Clean(p) == ".":
		return fmt.Errorf("invalid path: must name a file: %s", p)
	}
	items := strings.Split(p, "/")
	for _, item := range items {
		if item == ".." {
			return fmt.Errorf("invalid path: must not contain '..': %s", p)
		}
		if len(item) > 255 {
			return fmt.Errorf("invalid path: filenames must be less than or equal to %d characters", 255)
		}
	}
	if strings.HasPrefix(items[0], "..") && len(items[0]) > 2 {
		return fmt.Errorf("invalid path: must not start with '..': %s", p)
	}
	return nil
}

// payloadWritten says whether tsDir holds exactly the payload, contents and modes.
func payloadWritten(tsDir string, payload map[string]fileProjection) bool {
	seen := 0
	err := filepath.WalkDir(tsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(tsDir, p)
		if err != nil {
			return err
		}
		want, ok := payload[filepath.ToSlash(rel)]
		if !ok || !d.Type().IsRegular() {
			return errStale
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode().Perm() != want.mode || info.Size() != int64(len(want.data)) {
			return errStale
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(data, want.data) {
			return errStale
		}
		seen++
		return nil
	})
	return err == nil && seen == len(payload)
}

var errStale = errors.New("stale payload")

// writePayload writes the files into a new timestamped directory.
func writePayload(tsDir string, payload map[string]fileProjection, fsGroup *int64) error {
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return err
	}
	for p, f := range payload {
		full := filepath.Join(tsDir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(full, f.mode); err != nil { // past the umask
			return err
		}
	}
	if fsGroup != nil {
		return chownToFSGroup(tsDir, *fsGroup, true)
	}
	return nil
}

// linkUserVisible points each top-level name of the payload through "..data" and removes the links of
// names no longer in it. Anything else in dir (such as a directory a subPath mount made) is left alone.
func linkUserVisible(dir string, payload map[string]fileProjection, fsGroup *int64) error {
	want := map[string]bool{}
	for p := range payload {
		top, _, _ := strings.Cut(p, "/")
		want[top] = true
	}
	for name := range want {
		link, target := filepath.Join(dir, name), path.Join(dataDirName, name)
		cur, err := os.Readlink(link)
		switch {
		case err == nil && cur == target:
			continue
		case err == nil: // a symlink gone wrong: replace it
			if err := os.Remove(link); err != nil {
				return err
			}
		case !errors.Is(err, fs.ErrNotExist):
			continue // not a symlink: not ours
		}
		if err := os.Symlink(target, link); err != nil {
			return err
		}
		if fsGroup != nil {
			if err := os.Lchown(link, -1, int(*fsGroup)); err != nil {
				return err
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if want[n] || strings.HasPrefix(n, "..") || e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if target, err := os.Readlink(filepath.Join(dir, n)); err == nil && strings.HasPrefix(target, dataDirName+"/") {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// chownToFSGroup gives root and everything under it to the pod's fsGroup as the kubelet's
// SetVolumeOwnership does: group-readable (and -writable unless readOnly) files, setgid directories.
func chownToFSGroup(root string, gid int64, readOnly bool) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, -1, int(gid)); err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil // chmod would change the target
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mask := fs.FileMode(0o660)
		if readOnly {
			mask = 0o440
		}
		if d.IsDir() {
			mask |= fs.ModeSetgid | 0o110
		}
		return os.Chmod(p, info.Mode()|mask)
	})
}

// teardownVolumes unmounts (tmpfs) and removes everything setupVolumes made for the pod. Idempotent.
// It unmounts whatever is mounted under <podDir>/volumes (the tmpfs mounts, and anything a container
// propagated there), and removes nothing while a mount remains, so that it never deletes through a mount.
// hostPath directories and files are the host's and stay; podDir itself stays.
func teardownVolumes(podDir string) error {
	projectedTokens.forget(podDir) // no refresh writes into what is being removed
	forgetPodCertificates(podDir)
	root := filepath.Join(podDir, volumesDirName)
	if _, err := os.Lstat(root); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	mounts, err := mountPointsUnder(root)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- { // the last mounted first
		err := unix.Unmount(mounts[i], 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(mounts[i], unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mounts[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if mounts, err = mountPointsUnder(root); err != nil {
		return err
	} else if len(mounts) > 0 {
		return fmt.Errorf("removing %s: %s is still mounted", root, mounts[0])
	}
	return os.RemoveAll(root)
}

// isMountPoint says whether something is mounted on dir.
func isMountPoint(dir string) (bool, error) {
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false, err
	}
	mounts, err := readMountPoints()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m == realDir {
			return true, nil
		}
	}
	return false, nil
}

// mountPointsUnder lists the mount points at or under dir, in the order they were mounted.
func mountPointsUnder(dir string) ([]string, error) {
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	mounts, err := readMountPoints()
	if err != nil {
		return nil, err
	}
	var under []string
	for _, m := range mounts {
		if m == realDir || strings.HasPrefix(m, realDir+"/") {
			under = append(under, m)
		}
	}
	return under, nil
}

// readMountPoints lists this mount namespace's mount points from /proc/self/mountinfo, in mount order.
func readMountPoints() ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		if fields := strings.Fields(line); len(fields) >= 5 {
			mounts = append(mounts, unescapeMountinfo(fields[4]))
		}
	}
	return mounts, nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// containerMounts turns a container's volumeMounts into OCI mounts (rbind, with "ro" when readOnly), handling
// subPath (created inside the volume when missing; reject subPath with ".." or absolute path) and subPathExpr
// (expand $(VAR) from the container env given). Unknown volume name → error.
//
// Like the kubelet, it mounts configMap, secret, downwardAPI and projected volumes read-only whatever the
// volumeMount says, and a subPath of them does not follow later updates. A subPath is resolved to a real path
// inside the volume (symlinks that lead out of it are refused); a container able to write to the volume could
// still swap a directory for a symlink between this check and the runtime's mount, which the kubelet closes
// by bind-mounting through an open file descriptor. The mounts come back sorted by the depth of their
// destination (stable), so that a runtime mounting them in order does not hide one under another.
func containerMounts(c *corev1.Container, vols podVolumes, env []string) ([]specs.Mount, error) {
	var envMap map[string]string
	mounts := make([]specs.Mount, 0, len(c.VolumeMounts))
	for _, vm := range c.VolumeMounts {
		hostPath, ok := vols[vm.Name]
		if !ok {
			return nil, fmt.Errorf("cannot find volume %q to mount into container %q", vm.Name, c.Name)
		}
		subPath := vm.SubPath
		if vm.SubPathExpr != "" {
			if envMap == nil {
				envMap = envToMap(env)
			}
			var err error
			if subPath, err = expandSubPathExpr(vm.SubPathExpr, envMap); err != nil {
				return nil, fmt.Errorf("container %q: volumeMount %q: subPathExpr %q: %w", c.Name, vm.Name, vm.SubPathExpr, err)
			}
		}
		if subPath != "" {
			if filepath.IsAbs(subPath) {
				return nil, fmt.Errorf("container %q: volumeMount %q: subPath %q must not be an absolute path", c.Name, vm.Name, subPath)
			}
			for _, part := range strings.Split(subPath, "/") {
				if part == ".." {
					return nil, fmt.Errorf("container %q: volumeMount %q: subPath %q must not contain '..'", c.Name, vm.Name, subPath)
				}
			}
			var err error
			if hostPath, err = resolveSubPath(hostPath, subPath); err != nil {
				return nil, fmt.Errorf("container %q: volumeMount %q: subPath %q: %w", c.Name, vm.Name, subPath, err)
			}
		}
		opts := []string{"rbind"}
		switch p := vm.MountPropagation; {
		case p == nil || *p == corev1.MountPropagationNone:
			opts = append(opts, "rprivate")
		case *p == corev1.MountPropagationHostToContainer:
			opts = append(opts, "rslave")
		case *p == corev1.MountPropagationBidirectional:
			opts = append(opts, "rshared")
		default:
			return nil, fmt.Errorf("container %q: volumeMount %q: invalid mountPropagation %q", c.Name, vm.Name, *p)
		}
		switch {
		case vm.RecursiveReadOnly != nil && *vm.RecursiveReadOnly == corev1.RecursiveReadOnlyEnabled:
			opts = append(opts, "rro")
		case vm.ReadOnly || readOnlyVolume(vols[vm.Name]):
			opts = append(opts, "ro")
		default:
			opts = append(opts, "rw")
		}
		for _, o := range vm.BindMountOptions {
			switch o {
			case "noexec", "nodev", "nosuid":
				opts = append(opts, o)
			default:
				return nil, fmt.Errorf("container %q: volumeMount %q: bindMountOptions: %q is not one of noexec, nodev, nosuid", c.Name, vm.Name, o)
			}
		}
		mounts = append(mounts, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: hostPath, Options: opts})
	}
	sort.SliceStable(mounts, func(i, j int) bool {
		return mountDepth(mounts[i].Destination) < mountDepth(mounts[j].Destination)
	})
	return mounts, nil
}

func mountDepth(p string) int {
	p = filepath.Clean(p)
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}

// readOnlyVolume says whether a volume setupVolumes made is one the kubelet always mounts read-only.
func readOnlyVolume(hostPath string) bool {
	plugin := filepath.Dir(hostPath)
	if filepath.Base(filepath.Dir(plugin)) != volumesDirName {
		return false
	}
	switch filepath.Base(plugin) {
	case pluginConfigMap, pluginSecret, pluginDownwardAPI, pluginProjected, pluginImage:
		return true
	}
	return false
}

// resolveSubPath is the real path of subPath inside the volume at root, making the directories that are
// missing (with the mode of the volume's root, as the kubelet does). Symlinks are followed only while they
// stay inside the volume.
func resolveSubPath(root, subPath string) (string, error) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	rootInfo, err := os.Stat(realRoot)
	if err != nil {
		return "", err
	}
	perm := rootInfo.Mode() & (fs.ModePerm | fs.ModeSetgid)
	inside := func(p string) bool { return p == realRoot || strings.HasPrefix(p, realRoot+"/") }
	cur := realRoot
	for _, part := range strings.Split(subPath, "/") {
		if part == "" || part == "." {
			continue
		}
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) {
			if err := os.Mkdir(next, perm); err != nil && !errors.Is(err, fs.ErrExist) {
				return "", err
			}
			if fi, err = os.Lstat(next); err != nil {
				return "", err
			}
			if fi.IsDir() {
				if err := os.Chmod(next, perm); err != nil {
					return "", err
				}
			}
		} else if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			resolved, err := filepath.EvalSymlinks(next)
			if err != nil {
				return "", err
			}
			if !inside(resolved) {
				return "", fmt.Errorf("%s leads out of the volume", strings.TrimPrefix(next, realRoot+"/"))
			}
			next = resolved
		}
		cur = next
	}
	return cur, nil
}

// envToMap turns "NAME=value" strings into a map, later entries winning.
func envToMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// expandSubPathExpr expands $(VAR) in a subPathExpr; as in the kubelet, a variable that is unset or empty
// is an error.
func expandSubPathExpr(expr string, env map[string]string) (string, error) {
	missing := map[string]bool{}
	out := expandVars(expr, func(name string) string {
		v, ok := env[name]
		if !ok || v == "" {
			missing[name] = true
		}
		return v
	})
	if len(missing) > 0 {
		names := make([]string, 0, len(missing))
		for name := range missing {
			names = append(names, name)
		}
		sort.Strings(names)
		return "", fmt.Errorf("missing value for %s", strings.Join(names, ", "))
	}
	return out, nil
}
