package apiserver

import (
	"runtime/debug"
	"strings"

	apimachineryversion "k8s.io/apimachinery/pkg/version"
	basecompatibility "k8s.io/component-base/compatibility"

	"github.com/skiff-dev/skiff/internal/version"
)

// servedVersion is the EffectiveVersion of the chain, whose /version says which Kubernetes Skiff serves: the
// release of the k8s.io/apiserver library it is built on (v1.37.2), with Skiff's own version as SemVer build
// metadata (v1.37.2+skiff.v0.4.0), which `kubectl version` shows and the e2e framework parses. The library
// alone would say v0.0.0-master+$Format:%H$, which is stamped into kube's binaries by their build.
type servedVersion struct {
	basecompatibility.EffectiveVersion
	gitVersion string
}

func newServedVersion() servedVersion {
	return servedVersion{
		EffectiveVersion: basecompatibility.NewEffectiveVersionFromString(KubernetesVersion, "", ""),
		gitVersion:       kubernetesRelease() + "+skiff." + buildMetadata(version.Version),
	}
}

func (v servedVersion) Info() *apimachineryversion.Info {
	info := v.EffectiveVersion.Info()
	if info != nil {
		info.GitVersion, info.GitTreeState = v.gitVersion, "clean"
	}
	return info
}

// kubernetesRelease is v1.<minor>.<patch> of the k8s.io/apiserver module this binary links (v0.<minor>.<patch>).
func kubernetesRelease() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "k8s.io/apiserver" {
				v := m.Version
				if m.Replace != nil {
					v = m.Replace.Version
				}
				if strings.HasPrefix(v, "v0.") {
					return "v1." + strings.TrimPrefix(v, "v0.")
				}
			}
		}
	}
	return "v" + KubernetesVersion + ".0"
}

// buildMetadata makes s fit SemVer build metadata: dot-separated [0-9A-Za-z-] identifiers.
func buildMetadata(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, strings.Trim(s, "."))
}
