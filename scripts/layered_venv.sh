# Sourced by scripts/setup_sglang.sh and scripts/setup_vllm_venv.sh: a test venv layered on the trainer venv.
#
# layered_venv VENV TRAINER   (re)creates VENV on TRAINER's Python, --without-pip (TRAINER's pip installs into it with
#                             --python), with a .pth that adds TRAINER's site-packages behind VENV's own: addsitedir
#                             (not a bare path line), so the trainer's own .pth files (the editable nemo-gym-verl, ...)
#                             are processed too; appended, so the packages installed in VENV win. Sets SITE to VENV's
#                             site-packages.
layered_venv() {
  local venv="$1" trainer="$2" trainer_site
  rm -rf "$venv"
  "$trainer/bin/python" -m venv --without-pip "$venv"
  SITE="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  trainer_site="$("$trainer/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf 'import site; site.addsitedir(%s)\n' "'$trainer_site'" > "$SITE/zz_ngv_trainer_site.pth"
}
