"""scripts/why_normalization.py: the blog posts' first lesson, at initialization."""

from scripts import why_normalization


def test_without_a_norm_the_signal_and_the_gradient_shrink_and_rmsnorm_keeps_them():
    plain_std, plain_grad = why_normalization.linear_relu_stack(norm=False)
    normed_std, normed_grad = why_normalization.linear_relu_stack(norm=True)
    assert plain_std < 0.05 < 0.5 < normed_std < 1.5  # the posts' 0.016 against about 1
    assert plain_grad < normed_grad / 10


def test_the_residual_stream_grows_under_pre_norm_and_stays_at_1_under_post_norm():
    pre, post = why_normalization.residual_rms("pre"), why_normalization.residual_rms("post")
    assert pre == sorted(pre) and pre[-1] > 2 * pre[1]
    assert all(abs(rms - 1) < 0.01 for rms in post[1:])
